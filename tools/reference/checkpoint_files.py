"""A checkpoint directory's safetensors files: read (one file or shards) and written (shards past
SHARD_BYTES, with the index transformers and ferry read), for make_fixtures.py and mtp_fixture.py."""
import json
import os

from safetensors.torch import load_file, save_file


def load_shards(d):
    sd = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            sd.update(load_file(os.path.join(d, fn)))
    return sd


# The fixtures are committed, so no file of theirs is over 4 MiB: a larger checkpoint (trained_small's
# 8 MB) is written as shards with the index transformers and ferry read.
SHARD_BYTES = 4 << 20


def save_shards(sd, d):
    """sd as d/model.safetensors, or as shards of at most SHARD_BYTES in sd's order plus
    model.safetensors.index.json; replaces the checkpoint files d held."""
    for fn in os.listdir(d):
        if fn.endswith(".safetensors") or fn.endswith(".safetensors.index.json"):
            os.remove(os.path.join(d, fn))
    nbytes = {k: v.numel() * v.element_size() for k, v in sd.items()}
    groups, size = [[]], 0
    for k in sd:
        if groups[-1] and size + nbytes[k] > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += nbytes[k]
    if len(groups) == 1:
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, keys in enumerate(groups):
        fn = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: sd[k] for k in keys}, os.path.join(d, fn), metadata={"format": "pt"})
        weight_map.update({k: fn for k in keys})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(nbytes.values())}, "weight_map": dict(sorted(weight_map.items()))},
                  f, indent=2)
        f.write("\n")
