"""Is a forked probe's step as fast as the same step in this process? (MobileNet v2 224/16, float32 and bf16)."""
import sys, time, json
import mxfp16  # sets the threads before MXNet loads
import mxnet as mx
from mxnet import gluon
from gluoncv.model_zoo import get_model
from mxfp16.measure.probe import NetworkProbe
from mxfp16.plumbing.child import call_in_child
from mxfp16.machine.environment import mxnet_threads
from mxfp16._internals import mxnet_kernel_threads

model = sys.argv[1] if len(sys.argv) > 1 else "mobilenetv2_1.0"
ctx = [mx.cpu()]
net = get_model(model, classes=102, pretrained=False)
net.initialize(mx.init.Xavier(), ctx=ctx)
net.hybridize(static_alloc=True, static_shape=True)
data = [mx.nd.random.uniform(shape=(16, 3, 224, 224), ctx=ctx[0])]
label = [mx.nd.array(list(range(16)), ctx=ctx[0])]
net(data[0]).wait_to_read()
loss = gluon.loss.SoftmaxCrossEntropyLoss()

def clip_ms():
    x = mx.nd.random.uniform(-1, 7, shape=(16, 144, 56, 56)); mx.nd.waitall()
    t = time.perf_counter()
    for _ in range(20):
        y = mx.nd.clip(x, 0, 6)
    y.wait_to_read()
    return (time.perf_counter() - t) / 20 * 1000

def report():
    return {"mxnet_threads": mxnet_threads(), "mxnet_kernel_threads": mxnet_kernel_threads(), "clip_ms": round(clip_ms(), 2)}

out = {"model": model, "parent": report()}
out["child"], _ = call_in_child(report, fork=True)
probe = NetworkProbe(net, data, label, ctx, loss_fn=loss)
for p in ("float32", "amp-bfloat16"):
    out[f"forked {p}"] = probe.time(p, iters=5, warmup=2, repeats=3).get("ms_per_step")
out["in-process float32"] = probe._time_here("float32", 5, 2, 3)
out["parent after"] = report()
print(json.dumps(out, indent=1))
