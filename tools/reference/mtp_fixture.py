"""A trained MTP block for a trained case of make_fixtures.py (`--add-mtp NAME`), with its trunk frozen.

The case's checkpoint is read back from --out/NAME; one more (DSA, MoE) layer of the case's shape and
eh_proj / enorm / hnorm / shared_head.norm are drawn and trained on the same corpus with the MTP loss:
row t of the block's logits, fed the trunk's final hidden state at t and token t+1, against token t+2
(the draft for the position after the next). The embedding and the head are the trunk's, frozen with
the rest of it, so the trunk's tensors stay byte-identical: their sha256 is checked against the file
as it was, and the existing prefill / decode references and evaluation windows stay valid (a full
transformers pass over the case's tokens is compared with them). Then it writes mtp_logits.f32 (float64
reference, one row per position t < n-1 of input_ids + decode_tokens) and reference.json's `mtp`,
`mtp_training` and `mtp_checks` entries, and marks config.json with num_nextn_predict_layers 1.

The block's routed experts are balanced as the trunk's were (selection-bias updates, no loss term);
its DSA indexer gets no gradient (top-k selection), as in the trunk's training.
"""
import copy
import hashlib
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import Glm5NextForConditionalGeneration

import make_fixtures as mf
from checkpoint_files import load_shards, save_shards


def tensor_hashes(sd):
    return {k: hashlib.sha256(v.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest() for k, v in sd.items()}


def nextn_init(gen, dim):
    """eh_proj / enorm / hnorm / shared_head.norm as make_fixtures.py draws them for serve_tiny."""
    return dict(eh_proj=torch.randn(dim, 2 * dim, generator=gen, dtype=torch.float64) / math.sqrt(2 * dim),
                enorm=torch.rand(dim, generator=gen, dtype=torch.float64) * 0.6 + 0.7,
                hnorm=torch.rand(dim, generator=gen, dtype=torch.float64) * 0.6 + 0.7,
                shared_head_norm=torch.rand(dim, generator=gen, dtype=torch.float64) * 0.6 + 0.7)


class MtpEval:
    """Held-out MTP loss and draft agreement over fixed windows; the trunk's hidden states are computed
    once (it is frozen). Agreement: the block's top-1 at t equals the trunk's own top-1 at t+1, which
    is what a greedy K = 1 draft is accepted on."""

    def __init__(self, trunk, windows):
        self.ids = windows                                       # [W, L+2]
        L = windows.shape[1] - 2
        with torch.no_grad():
            h = trunk.model(input_ids=windows[:, :L + 1], use_cache=False).last_hidden_state.float()
            self.hidden = h[:, :L]
            self.trunk_next = trunk.lm_head(h[:, 1:L + 1]).argmax(-1)

    def __call__(self, mtp):
        with torch.no_grad():
            logits = mtp(self.hidden, self.ids[:, 1:-1]).float()
        target = self.ids[:, 2:]
        loss = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1)))
        top = logits.argmax(-1)
        return dict(loss=round(loss, 4), agreement=round(float((top == self.trunk_next).float().mean()), 4),
                    accuracy=round(float((top == target).float().mean()), 4))


def windows_of(tokens, length, count):
    n = min(count, len(tokens) // length)
    return torch.stack([tokens[i * length:(i + 1) * length] for i in range(n)])


def train_mtp(trunk, layer, nextn, spec, corpus, train_window):
    """AdamW on random windows of the training text, the learning rate warmed up and then cosine to zero
    over the time budget; final weights kept. Returns what reference.json records of the run."""
    tr = spec["mtp_train"]
    gen = torch.Generator().manual_seed(spec["seed"] + 3)
    data = corpus["train"]
    L, B = tr["seq_len"], tr["batch"]
    span = torch.arange(L + 2)
    cfg = trunk.config.text_config
    embed, head = mf.text_model(trunk).embed_tokens, trunk.lm_head
    mtp = lambda h, nt: mf.mtp_forward(layer, nextn, embed, head, h, nt, cfg.rms_norm_eps)
    held = MtpEval(trunk, windows_of(corpus["heldout"], tr["eval_len"] + 2, tr["eval_windows"]))
    seen = MtpEval(trunk, train_window[None])
    params = [p for p in layer.parameters()] + list(nextn.values())
    opt = torch.optim.AdamW([dict(params=[p for p in params if p.dim() >= 2], weight_decay=tr["weight_decay"]),
                             dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)],
                            lr=tr["lr"], betas=(0.9, 0.95))
    router = layer.mlp.gate
    loads = []
    hook = router.register_forward_hook(lambda m, a, out: loads.append(torch.bincount(out[2].flatten(),
                                                                                       minlength=m.num_experts)))

    def point(step, elapsed, recent):
        row = dict(step=step, seconds=round(elapsed, 1))
        if recent:
            row["train"] = round(float(np.mean(recent)), 4)
        h, s = held(mtp), seen(mtp)
        row.update(heldout=h["loss"], heldout_agreement=h["agreement"], heldout_accuracy=h["accuracy"],
                   train_window_agreement=s["agreement"])
        print(f"  mtp step {step} {elapsed:.0f}s {row}", flush=True)
        return row

    layer.train()
    curve = [point(0, 0.0, [])]
    budget = tr["max_seconds"]
    t0, step, recent, share = time.time(), 0, [], []
    while (elapsed := time.time() - t0) < budget:
        for g in opt.param_groups:
            g["lr"] = tr["lr"] * min(1.0, (step + 1) / tr["warmup_steps"]) * 0.5 * (1 + math.cos(math.pi * elapsed / budget))
        starts = torch.randint(0, len(data) - L - 2, (B,), generator=gen)
        batch = data[starts[:, None] + span]
        with torch.no_grad():
            h = trunk.model(input_ids=batch[:, :L], use_cache=False).last_hidden_state
        loads.clear()
        logits = mtp(h, batch[:, 1:L + 1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 2:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            n = torch.stack(loads).sum(0).float()
            router.e_score_correction_bias += tr["balance_rate"] * torch.sign(n.mean() - n)
            share.append(float(n.max() / n.sum()))
        step += 1
        recent.append(float(loss))
        if time.time() - t0 >= budget * len(curve) / tr["evals"]:
            layer.eval()
            curve.append(point(step, time.time() - t0, recent))
            layer.train()
            recent = []
    hook.remove()
    layer.eval()
    if curve[-1]["step"] != step:
        curve.append(point(step, time.time() - t0, recent))
    m = corpus["manifest"]
    return dict(corpus=m if m is not None else f"{len(data)} training tokens", device="cpu",
                threads=torch.get_num_threads(), steps=step, tokens_seen=step * B * L,
                epochs=round(step * B * L / len(data), 3), kept="final weights", curve=curve,
                busiest_expert_share_last_100_steps=round(float(np.mean(share[-100:])), 3) if share else None,
                frozen="the whole trunk, its embedding and head included", **tr)


def mtp_reference(ref, layer64, nextn64, ref_json, kpool, topk):
    """Float64 full pass over input_ids + decode_tokens: the trunk's logits (to hold against the stored
    prefill / decode files) and the MTP block's, with its DSA selections and router margin."""
    cfg = ref.config.text_config
    probes = mf.Probes(ref, cfg, [("mtp", layer64.self_attn.indexer)])
    probes.add_module_hooks(layer64)
    ids = torch.tensor([ref_json["input_ids"] + ref_json["decode_tokens"]])
    with torch.no_grad():
        hidden = ref.model(input_ids=ids, use_cache=False).last_hidden_state
        full = ref.lm_head(hidden)[0].double()
        probes.clear()
        probes.record_scores = True
        logits = mf.mtp_forward(layer64, nextn64, mf.text_model(ref).embed_tokens, ref.lm_head, hidden[0, :-1],
                                ids[0, 1:], cfg.rms_norm_eps).double()
        probes.record_scores = False
    n = ids.shape[1]
    margins = mf.selection_margins({"mtp": layer64.self_attn.indexer}, probes.indexer_inputs, lambda k: kpool,
                                   lambda k: topk, n)
    positions = mf.full_selections(probes.selections["mtp"], kpool)
    probes.remove()
    if positions != margins["mtp"]["recomputed"]:
        raise RuntimeError("the MTP block's DSA selections differ from their float64 re-scoring")
    return dict(full=full, logits=logits, positions=positions, dsa_margin=margins["mtp"],
                router_margin=probes.router_margin, clamp=dict(probes.clamp))


def add_trained_mtp(spec, out_dir, corpus_dir):
    name = spec["name"]
    case_dir = os.path.join(out_dir, name)
    ref_path = os.path.join(case_dir, "reference.json")
    ref_json = json.load(open(ref_path))
    if "mtp" in ref_json:
        raise RuntimeError(f"{case_dir} has an MTP block already")
    before = tensor_hashes(load_shards(case_dir))
    corpus = mf.load_corpus(corpus_dir)

    trunk = Glm5NextForConditionalGeneration.from_pretrained(case_dir, dtype=torch.float32).eval()
    mf.force_reference_kernels(trunk)
    for p in trunk.parameters():
        p.requires_grad_(False)
    text = dict(spec["text"])
    n_layers = len(text["layer_types"])
    full_text = dict(text, layer_types=text["layer_types"] + [mf.D], mlp_layer_types=text["mlp_layer_types"] + ["sparse"])
    big = Glm5NextForConditionalGeneration(mf.make_config(full_text)).eval()
    missing, unexpected = big.load_state_dict(trunk.state_dict(), strict=False)
    prefix = f"model.language_model.layers.{n_layers}."
    if unexpected or any(not k.startswith(prefix) for k in missing):
        raise RuntimeError(f"trunk does not fit the larger model: missing {missing} unexpected {unexpected}")
    gen = torch.Generator().manual_seed(spec["seed"] + 2)
    tcfg = big.config.text_config
    mf.randomise(big, gen, tcfg.hidden_size, tcfg.hc_mult, only_prefix=prefix)
    mf.force_reference_kernels(big)
    layer = mf.text_model(big).layers[n_layers]
    nextn = {k: torch.nn.Parameter(v.float()) for k, v in nextn_init(gen, tcfg.hidden_size).items()}
    train_window = torch.tensor(json.load(open(os.path.join(case_dir, "window_train.json")))["input_ids"])
    training = train_mtp(trunk, layer, nextn, spec, corpus, train_window)

    # bf16 as the trunk; the trunk's tensors are written back from the file untouched
    mf.round_to_bf16(layer)
    with torch.no_grad():
        for v in nextn.values():
            v.copy_(v.to(torch.bfloat16).float())
    sd = load_shards(case_dir)
    sd.update(mf.mtp_tensors(big, nextn, n_layers, torch.bfloat16))
    save_shards(sd, case_dir)
    mf.mark_mtp_config(case_dir)
    after = tensor_hashes(load_shards(case_dir))
    changed = [k for k, h in before.items() if after.get(k) != h]
    added = [k for k in after if k not in before]
    if changed or any(not k.startswith(prefix) for k in added):
        raise RuntimeError(f"trunk tensors changed: {changed}; added outside the MTP block: "
                           f"{[k for k in added if not k.startswith(prefix)]}")

    # the float64 reference, the trunk as transformers loads the new file
    ref = Glm5NextForConditionalGeneration.from_pretrained(case_dir, dtype=torch.float64).eval()
    mf.force_reference_kernels(ref)
    big64 = copy.deepcopy(big).to(torch.float64)
    mf.force_reference_kernels(big64)
    nextn64 = {k: v.detach().double() for k, v in nextn.items()}
    cfg = ref.config.text_config
    r = mtp_reference(ref, mf.text_model(big64).layers[n_layers], nextn64, ref_json, cfg.index_kpool, cfg.index_topk)
    P, S, V = ref_json["prompt_len"], ref_json["decode_steps"], ref_json["vocab_size"]
    stored = lambda f, rows: torch.from_numpy(np.fromfile(os.path.join(case_dir, f), dtype="<f4").reshape(rows, V)).double()
    vs_prefill = mf.max_abs(r["full"][:P], stored("prefill_logits.f32", P))
    vs_decode = mf.max_abs(r["full"][P:P + S], stored("decode_logits.f32", S))
    if max(vs_prefill, vs_decode) > mf.CACHE_TOLERANCE:
        raise RuntimeError(f"the trunk's logits moved: prefill {vs_prefill:.3e}, decode {vs_decode:.3e}")
    mf.write_f32(os.path.join(case_dir, "mtp_logits.f32"), r["logits"])

    ref_json["mtp"] = dict(layer=n_layers, rows=int(r["logits"].shape[0]), logits_file="mtp_logits.f32",
                           input="row t: trunk final hidden state (after stream mean and norm) at position t, "
                                 "token at position t+1 of input_ids + decode_tokens",
                           generator=f"tools/reference/make_fixtures.py --add-mtp {name}, seed {spec['seed'] + 2}; "
                                     f"transformers {transformers.__version__}, torch {torch.__version__}, CPU",
                           router_margin=r["router_margin"], swiglu_clamp=r["clamp"])
    ref_json["dsa"]["layers"]["mtp"] = {"positions": r["positions"]}
    ref_json["dsa"]["margins"]["mtp"] = dict(min_margin=r["dsa_margin"]["min_margin"],
                                             score_scale=r["dsa_margin"]["score_scale"])
    ref_json["mtp_training"] = training
    ref_json["mtp_checks"] = dict(trunk_tensors_sha256_unchanged=len(before), mtp_tensors_added=len(added),
                                  full_pass_vs_stored_prefill=vs_prefill, full_pass_vs_stored_decode=vs_decode)
    with open(ref_path, "w") as f:
        json.dump(mf.finite_json(ref_json), f, separators=(",", ":"), allow_nan=False)
    sizes = {fn: os.path.getsize(os.path.join(case_dir, fn)) for fn in sorted(os.listdir(case_dir))}
    print(f"  {name}: MTP block added; {len(before)} trunk tensors unchanged, {len(added)} added; full pass vs "
          f"stored prefill {vs_prefill:.2e} decode {vs_decode:.2e}; router margin {r['router_margin']:.2e}; "
          f"{sum(sizes.values()) / 1e6:.2f} MB: {sizes}")
