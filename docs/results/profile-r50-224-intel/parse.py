"""Sum oneDNN verbose exec times by primitive and by (primitive, implementation), per step."""
import collections, json, sys
steps = int(sys.argv[2])
by_prim, by_impl = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    if not line.startswith("dnnl_verbose,exec,"):
        continue
    f = line.rstrip().split(",")
    prim, impl, ms = f[3], f[4], float(f[-1])
    by_prim[prim] += ms / steps
    by_impl[f"{prim} {impl} {f[5]}"] += ms / steps
json.dump({"ms_per_step_by_primitive": dict(by_prim.most_common()),
           "ms_per_step_by_implementation": dict(by_impl.most_common(25))}, sys.stdout, indent=1)
