import sys, time, os
import mxfp16
from mxfp16.machine.environment import set_threads; set_threads()
import mxnet as mx
from mxfp16.bench.runner import BenchSpec, _Batches
from mxfp16.casting import cast_batch
from mxfp16.train.parts import PartsSpec, build_parts
from mxfp16.devices import as_context_list
from mxfp16.precision import resolve_precision
from mxfp16.step import train_step
prec_name = sys.argv[1]; bs = int(sys.argv[2]) if len(sys.argv) > 2 else 16
spec = BenchSpec(precision=prec_name, batch_size=bs, ctx="cpu")
ctx = as_context_list("cpu"); precision = resolve_precision(prec_name, ctx)
batches = _Batches(spec)
parts = build_parts(PartsSpec(model="resnet50_v2", classes=102, image_size=224, precision=precision, ctx=ctx,
    optimizer="sgd", lr=0.01, momentum=0.9, wd=1e-4, amp_lists="mxfp16", seed=0))
def step():
    data, label = cast_batch(*batches.next(), precision.data_dtype, ctx)
    return train_step(parts.net, parts.loss, parts.trainer, data, label, parts.scaler).loss
for _ in range(3): step()
mx.nd.waitall()
t = time.perf_counter()
for _ in range(5): step()
mx.nd.waitall(); print("plain s/step", (time.perf_counter() - t) / 5)
if os.environ.get("PROFILE"):
    mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename="/tmp/prof/p.json")
    mx.profiler.set_state("run")
    for _ in range(3): step()
    mx.nd.waitall()
    mx.profiler.set_state("stop")
    print(mx.profiler.dumps(sort_by="total", ascending=False)[:6000])
