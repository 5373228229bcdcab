"""Copy transformers' glm5_next sources into $OUT and list a tiny model's parameters.

Run on the accelerator machine (transformers >= 5.17): it tells us the exact config fields,
the saved tensor names and shapes, before fixtures are generated.
"""
import os, shutil, json, sys, traceback
import transformers

out = os.environ.get("OUT", "/tmp/out")
src = os.path.join(os.path.dirname(transformers.__file__), "models", "glm5_next")
print("transformers", transformers.__version__, src)
for f in sorted(os.listdir(src)):
    print("  ", f)
    if f.endswith(".py"):
        shutil.copy(os.path.join(src, f), os.path.join(out, f))
try:
    import torch
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration
    cfg = Glm5NextConfig()
    print(json.dumps(cfg.to_dict(), indent=1, default=str)[:6000])
except Exception:
    traceback.print_exc()
