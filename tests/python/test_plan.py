"""`ferry plan`: the memory plan without the machine (--device-memory, --host-memory). The user's four
V100s and budgets, the full shape on one H200 (pooled, the rest on the host), a model that fits (no
pool at all), and every budget that cannot be kept refused with the option named and the amount."""
import json
import pathlib
import subprocess

SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "configs"
FULL = SHARED / "glm-5.3-flash.json"
SMALL = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "glm5" / "serve_tiny" / "config.json"


def plan(ferry_bin, *args, config=FULL):
    r = subprocess.run([ferry_bin, "plan", "--synthetic", str(config), "--type", "q4_k", "--json", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def test_the_users_machine_fits_with_smaller_prefill_chunks(ferry_bin):
    users = ["--device-memory", "32GiB,32GiB,32GiB,32GiB", "--host-memory", "123GiB", "--split", "11,23,34",
             "--host-expert-budget", "84GiB", "--ctx", "32768"]
    code, p = plan(ferry_bin, *users, "--expert-pool-cap", "25.5GiB,26.5GiB,26.5GiB,25.4GiB")
    assert code == 1  # 4,096-token prefill chunks leave too little workspace room on 32 GiB
    assert all("--expert-pool-cap" in x for x in p["problems"]), p["problems"]
    code, p = plan(ferry_bin, *users, "--expert-pool-cap", "22GiB", "--prefill-chunk", "2048")
    assert code == 0, p["problems"]
    assert [s["first_layer"] for s in p["stages"]] == [0, 11, 23, 34]
    assert all(not s["resident"] and s["pool_slots"] > 1500 for s in p["stages"])
    assert p["experts_total"] == 12096
    pooled = sum(s["pool_slots"] for s in p["stages"])
    assert p["host"]["store_bytes"] == (12096 - pooled) * p["expert_slot_bytes"]
    assert p["host"]["store_bytes"] <= 84 << 30


def test_the_full_shape_on_one_h200_pools_what_fits(ferry_bin):
    code, p = plan(ferry_bin, "--device-memory", "139GiB", "--host-memory", "120GiB", "--ctx", "32768", "--slots", "1")
    assert code == 0, p["problems"]
    (stage,) = p["stages"]
    assert not stage["resident"] and 8000 < stage["pool_slots"] < 12096
    assert p["devices"][0]["free"] < 1 << 30  # the pool takes what is left


def test_a_model_that_fits_is_placed_whole_without_a_pool(ferry_bin):
    code, p = plan(ferry_bin, "--device-memory", "8GiB", "--host-memory", "30GiB", config=SMALL)
    assert code == 0
    assert all(s["resident"] for s in p["stages"])
    assert p["host"]["store_bytes"] == 0


def test_budgets_that_cannot_be_kept_are_named(ferry_bin):
    base = ["--device-memory", "139GiB", "--ctx", "32768", "--slots", "1"]
    _, p = plan(ferry_bin, *base, "--host-memory", "120GiB", "--expert-pool-cap", "200GiB")
    assert any("--expert-pool-cap 200.00 GiB for device 0 is larger" in x for x in p["problems"]), p
    _, p = plan(ferry_bin, *base, "--host-memory", "120GiB", "--host-expert-budget", "10GiB")
    assert any("raise it by" in x and "--host-expert-budget" in x for x in p["problems"]), p
    _, p = plan(ferry_bin, *base, "--host-memory", "40GiB")
    assert any("--ram-floor" in x for x in p["problems"]), p
    # The prefix cache's budget is host RAM too, with or without an expert store.
    code, p = plan(ferry_bin, "--device-memory", "8GiB", "--host-memory", "30GiB", "--checkpoint-budget", "12",
                   config=SMALL)
    assert code == 1 and p["host"]["checkpoint_bytes"] == 12 << 30, p
    assert any("--checkpoint-budget (12.00 GiB) leaves less than --ram-floor" in x and "by 2.00 GiB" in x
               for x in p["problems"]), p["problems"]
    r = subprocess.run([ferry_bin, "plan", "--synthetic", str(SMALL), "--device-memory", "8GiB", "--checkpoint-budget",
                        "nan"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--checkpoint-budget: GiB in [0, 65536]" in r.stderr, r.stderr
    _, p = plan(ferry_bin, "--device-memory", "4GiB", "--host-memory", "120GiB")
    assert any("device 0 needs" in x and "lower --ctx or --slots" in x for x in p["problems"]), p


def test_the_host_kv_tier_is_planned_and_its_budget_refused_naming_the_need(ferry_bin):
    """Past --kv-resident the device keeps the window and its planner's tables, the host every slot's
    rows (int8: 516 bytes a row, 11 DSA layers); a --kv-host-budget that cannot hold them is a problem naming budget and need."""
    args = ["--device-memory", "139GiB", "--host-memory", "200GiB", "--ctx", "131072", "--slots", "3"]
    code, p = plan(ferry_bin, *args, "--kv-resident", "0")
    assert p["host"]["kv_bytes"] == 0 and p["kv_resident"] == 0
    all_on_device = sum(s["device_kv_bytes"] for s in p["stages"])
    code, p = plan(ferry_bin, *args)  # the default window, 32768 rows
    need = 3 * 131072 * 11 * 516
    assert p["kv_resident"] == 32768 and p["host"]["kv_bytes"] == need, p["host"]
    assert sum(s["host_kv_bytes"] for s in p["stages"]) == need
    # The window's planner tables stay on the device: 4 B a token and 6 B a window row, per DSA layer and slot.
    tables = 3 * 11 * (131072 * 4 + 32768 * 6 + 8)
    assert p["kv_table_bytes"] == tables, p["kv_table_bytes"]
    # The prefill gather (gpu/prefill_gather.hpp), once a stage: a claim per token and slot, a staging of
    # the window's rows (int8 data, scales, keys) and a step's rewritten selections (4,099 rows x 2,052).
    gather = 3 * 131072 * 4 + 32768 * (512 + 4 + 4) + 4099 * 2052 * 4 + 24
    assert all_on_device - sum(s["device_kv_bytes"] for s in p["stages"]) == \
        3 * (131072 - 32768) * 11 * 516 - tables - gather
    assert p["host"]["kv_budget"] is None
    code, p = plan(ferry_bin, *args, "--kv-host-budget", "2")
    assert code == 1
    assert any("the host KV tier needs 2.08 GiB" in x and "more than --kv-host-budget 2.00 GiB" in x
               for x in p["problems"]), p["problems"]
    code, p = plan(ferry_bin, *args, "--kv-host-budget", "3")
    assert code == 0 and p["host"]["kv_budget"] == 3 << 30, p["problems"]
    # The tier is host RAM with the rest, against the floor.
    _, p = plan(ferry_bin, *args[:2], "--host-memory", "10GiB", "--ctx", "524288", "--slots", "3")
    assert any("the host KV tier (8.31 GiB)" in x and "--ram-floor" in x for x in p["problems"]), p["problems"]
    r = subprocess.run([ferry_bin, "plan", "--synthetic", str(FULL), "--device-memory", "139GiB", "--kv-host-budget",
                        "-2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--kv-host-budget: GiB in [0, 65536]" in r.stderr, r.stderr


def test_device_kv_past_the_window_grows_only_by_the_pool_keys(ferry_bin):
    """Past --kv-resident the device keeps the window's latent rows, every complete pool's key (128 f32
    per 4 tokens and DSA layer) and the indexer's per-token keys and gates in a ring of a step's rows
    (kpool - 1 + prefill chunk + slots), not ctx of them: doubling the context adds the pool keys and
    the window's position table (4 B a token and DSA layer) and the prefill gather's claims (4 B a
    token) only, and all resident the keys and gates
    are the ring's."""
    args = ["--device-memory", "139GiB", "--host-memory", "200GiB", "--slots", "3"]
    kv = {}
    for ctx in (262144, 524288):
        code, p = plan(ferry_bin, *args, "--ctx", str(ctx))
        kv[ctx] = sum(s["device_kv_bytes"] for s in p["stages"])
    added = 3 * (524288 - 262144) * 11
    gather_claims = 3 * (524288 - 262144) * 4  # the prefill gather's, 4 B a token and slot (one stage)
    assert kv[524288] - kv[262144] == added // 4 * 128 * 4 + added * 4 + gather_claims
    ring = 3 + 4096 + 3  # kpool - 1, the default prefill chunk, a decode row per slot
    code, p = plan(ferry_bin, *args, "--ctx", "32768", "--kv-resident", "0", "--kv-type", "f32")
    latent, pools, keys = 3 * 32768 * 11 * 2048, 3 * 32768 // 4 * 11 * 512, 3 * ring * 11 * 2 * 512
    assert sum(s["device_kv_bytes"] for s in p["stages"]) == latent + pools + keys


TWELVE = SHARED / "glm-5.3-flash-12-layers.json"


def test_kv_resident_by_default_is_the_plans_choice(ferry_bin):
    """Without --kv-resident every slot's DSA rows stay on the device when they fit beside the weights,
    the experts (or the same pool) and the rest; else the window of 32,768 rows, the plan saying why;
    an explicit --kv-resident wins either way."""
    base = ["--host-memory", "200GiB", "--ctx", "1048576", "--slots", "3"]

    def need(p):
        return p["devices"][0]["memory"] - p["devices"][0]["free"]

    code, every = plan(ferry_bin, "--device-memory", "139GiB", *base, config=TWELVE)
    assert code == 0 and every["kv_resident"] == 0 and not every["kv_resident_given"], every
    assert every["host"]["kv_bytes"] == 0 and "fit on the devices" in every["kv_resident_why"]
    assert all(s["resident"] for s in every["stages"])
    _, window = plan(ferry_bin, "--device-memory", "139GiB", *base, "--kv-resident", "32768", config=TWELVE)
    assert window["kv_resident_given"] and window["kv_resident_why"] == "given"
    assert need(window) < need(every)
    # A device that holds the windowed plan with every expert but not every row as well: the window.
    between = (need(window) + need(every)) // 2
    code, p = plan(ferry_bin, "--device-memory", str(between), *base, config=TWELVE)
    assert code == 0 and p["kv_resident"] == 32768 and not p["kv_resident_given"], p
    assert all(s["resident"] for s in p["stages"])
    assert "more on device 0" in p["kv_resident_why"] and "the experts" in p["kv_resident_why"], p["kv_resident_why"]
    assert p["host"]["kv_bytes"] == window["host"]["kv_bytes"] > 0
    # The full shape pools its experts: every row would shrink the pool, so the window.
    code, p = plan(ferry_bin, "--device-memory", "139GiB", *base[:2], "--ctx", "131072", "--slots", "3")
    assert code == 0 and p["kv_resident"] == 32768 and "the expert pool" in p["kv_resident_why"], p
    # Within the window the context is all on the device anyway; given values win.
    _, p = plan(ferry_bin, "--device-memory", "139GiB", *base[:2], "--ctx", "16384", config=TWELVE)
    assert p["kv_resident"] == 0 and "within the window" in p["kv_resident_why"], p
    _, p = plan(ferry_bin, "--device-memory", "139GiB", *base, "--kv-resident", "4096", config=TWELVE)
    assert p["kv_resident"] == 4096 and p["kv_resident_given"] and p["host"]["kv_bytes"] > 0
    r = subprocess.run([ferry_bin, "plan", "--synthetic", str(TWELVE), "--type", "q4_k", "--device-memory", "139GiB",
                        *base], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--kv-resident 0, chosen by the plan" in r.stdout, r.stdout


def test_bad_options_fail_naming_them(ferry_bin):
    for args, text in ((["--device-memory", "lots"], "--device-memory"),
                       (["--device-memory", "80GiB", "--expert-pool-cap", "x"], "--expert-pool-cap"),
                       (["--device-memory", "80GiB", "--miss-path", "teleport"], "--miss-path = teleport"),
                       (["--device-memory", "80GiB", "--split", "9,3"], "boundary 3")):
        r = subprocess.run([ferry_bin, "plan", "--synthetic", str(FULL), *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and text in r.stderr, (args, r.stderr)


def test_the_plan_counts_device_kv_in_the_kv_type(ferry_bin):
    """Each stage's device KV (its slots' DSA rows) in the plan: int8 latent rows take 516 bytes (512
    codes + a scale) where f32 takes 2048, for each of the 11 DSA layers, every slot and position."""
    args = ["--device-memory", "139GiB", "--host-memory", "120GiB", "--ctx", "32768", "--slots", "3"]
    kv = {}
    for t in ("f32", "int8"):
        code, p = plan(ferry_bin, *args, "--kv-type", t)
        assert p["kv_type"] == t
        kv[t] = sum(s["device_kv_bytes"] for s in p["stages"])
    assert kv["f32"] - kv["int8"] == 3 * 32768 * 11 * (2048 - 516)
    code, p = plan(ferry_bin, *args)
    assert p["kv_type"] == "int8"  # the CUDA default
    r = subprocess.run([ferry_bin, "plan", "--synthetic", str(FULL), "--device-memory", "139GiB", "--host-memory",
                        "120GiB", "--kv-type", "q4"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--kv-type: KV type 'q4'" in r.stdout + r.stderr


def _q4k_bytes(*dims, keep_f32=False):
    """Bytes of a synthetic --type q4_k tensor: f32 where the catalogue keeps it so, q4_k where its rows
    are whole 256-blocks, else q8_0 (32-blocks of 34 bytes)."""
    n = 1
    for d in dims:
        n *= d
    if keep_f32:
        return 4 * n
    if dims[0] % 256 == 0:
        return n // 256 * 144
    assert dims[0] % 32 == 0
    return n // 32 * 34


def _mtp_expected(c, slots, ctx, step_rows, stages):
    """The MTP block's device bytes from the config's shapes: one DSA layer with a full indexer, an MoE
    FFN with every routed expert, the nextn projections and (synthetic) its own embedding and head; a
    DSA layer's state in int8 rows for every slot's whole context; the block's row buffers; and each
    stage's verify keep (every slot's KDA conv + recurrent state)."""
    D, V, qlr, kvlr = c["hidden_size"], c["vocab_size"], c["q_lora_rank"], c["kv_lora_rank"]
    nh, nope, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    ih, idim, kp = c["index_n_heads"], c["index_head_dim"], c["index_kpool"]
    E, I, S = c["n_routed_experts"], c["moe_intermediate_size"], c["moe_intermediate_size"] * c["n_shared_experts"]
    q, f32 = _q4k_bytes, lambda *d: _q4k_bytes(*d, keep_f32=True)
    experts = q(D, I, E) + q(D, I, E) + q(I, D, E)
    weights = (f32(D) + q(D, qlr) + f32(qlr) + q(qlr, nh * nope) + q(D, kvlr) + f32(kvlr) + q(nope, kvlr, nh) +
               q(kvlr, vd, nh) + q(nh * vd, D) +
               q(qlr, ih * idim) + q(D, idim) + f32(idim) + f32(idim) + f32(D, ih) + q(D, idim) + f32(idim, kp) +
               f32(D) + f32(D, E) + f32(E) + experts + q(D, S) + q(D, S) + q(S, D) +
               q(2 * D, D) + 3 * f32(D) + 2 * q(D, V))
    M = step_rows + slots  # the workspace's rows: a step's, and a pending entry per slot
    buffers = 4 * M + 4 * 6 * M * D + 4 * 3 * slots * D + 4 * 8 * slots + 32 * min(max((128 << 20) // V, 8), M)
    state = slots * ctx * (kvlr + 4) + 4 * slots * (2 * ctx + ctx // kp) * idim + buffers
    nk, hd, K = c["linear_num_heads"], c["linear_head_dim"], c["linear_conv_kernel_dim"]
    kda_slot = 4 * (3 * nk * hd * (K - 1) + nk * hd * hd)
    keep = [slots * kda_slot * sum(c["layer_types"][l] == "linear_attention" for l in range(a, b)) for a, b in stages]
    return experts, weights, state, keep


def test_mtp_counts_the_block_on_the_last_stage_and_the_pools_get_that_much_less(ferry_bin):
    """--mtp 1 on the released shape: the last stage's device holds the MTP block (weights with all 288
    routed experts, its DSA state for every slot's context, its row buffers, the workspace's pending
    rows) and every stage a verify keep, all as computed here from the config; the devices' pools get
    exactly that much less than with --mtp off at the same step width (serve widens a step by the
    verify sets: 2 * 3 rows a slot)."""
    c = json.loads(FULL.read_text())["text_config"]
    slots, ctx, chunk = 3, 32768, 2048
    args = ["--device-memory", "32GiB,32GiB,32GiB,32GiB", "--host-memory", "400GiB", "--split", "11,23,34",
            "--ctx", str(ctx), "--slots", str(slots)]
    verify = slots * 2 * 3
    _, on = plan(ferry_bin, *args, "--prefill-chunk", str(chunk), "--mtp", "1")
    _, off = plan(ferry_bin, *args, "--prefill-chunk", str(chunk + verify), "--mtp", "off")
    _, plain = plan(ferry_bin, *args, "--prefill-chunk", str(chunk + verify))
    assert off == plain  # --mtp off changes nothing
    assert on["mtp"] == {"requested": True, "block": True} and not on["problems"], on["problems"]
    stages = [(s["first_layer"], s["end_layer"]) for s in on["stages"]]
    experts, weights, state, keep = _mtp_expected(c, slots, ctx, chunk + slots + verify, stages)
    assert experts > 4e9 and weights - experts < 1 << 30  # ~4 GB of routed experts; the rest under 1 GiB
    last = on["stages"][-1]["mtp"]
    assert last["weights"] == weights and last["state"] == state, last
    assert [s["mtp"]["keep"] for s in on["stages"]] == keep
    assert all(s["mtp"]["weights"] == s["mtp"]["state"] == s["mtp"]["workspace"] == 0 for s in on["stages"][:-1])
    # The workspace's extra: one row a slot more (its cost per row from two --mtp off plans a row apart,
    # less the inbox's row: the pending entries are not handed over).
    _, wider = plan(ferry_bin, *args, "--prefill-chunk", str(chunk + verify + 1))
    per_row = wider["stages"][-1]["workspace_bytes"] - off["stages"][-1]["workspace_bytes"] - 4 * c["hc_mult"] * c["hidden_size"]
    assert last["workspace"] == slots * per_row
    assert last["total"] == weights + state + keep[-1] + slots * per_row
    for d_on, d_off, s_on, s_off in zip(on["devices"], off["devices"], on["stages"], off["stages"]):
        assert d_on["mtp"] == s_on["mtp"]["total"]
        for k in ("dense", "state", "workspace", "margin"):
            assert d_on[k] == d_off[k], k
        assert d_on["experts"] + d_on["free"] == d_off["experts"] + d_off["free"] - d_on["mtp"]
        lost = s_off["pool_slots"] - s_on["pool_slots"]
        assert d_on["mtp"] // on["expert_slot_bytes"] <= lost <= d_on["mtp"] // on["expert_slot_bytes"] + 1
    # A last device with room for its stage but not for the MTP block too: refused, naming it.
    small = ["--device-memory", "32GiB,32GiB,32GiB,10GiB", *args[2:], "--prefill-chunk", str(chunk)]
    code, p = plan(ferry_bin, *small)
    assert code == 0, p["problems"]
    code, p = plan(ferry_bin, *small, "--mtp", "auto")
    assert code == 1
    assert any(x.startswith("device 3 needs") and "the MTP block (" in x and "--mtp off" in x for x in p["problems"]), p
    r = subprocess.run([ferry_bin, "plan", "--synthetic", str(FULL), "--device-memory", "139GiB", "--mtp", "5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--mtp 5" in r.stderr, r.stderr
    r = subprocess.run([ferry_bin, "plan", "--synthetic", str(FULL), *args, "--mtp", "1"],
                       capture_output=True, text=True, timeout=60)
    assert "MTP block (stage 3, device 3): weights" in r.stdout and "| MTP |" in r.stdout, r.stdout


def test_mtp_on_a_model_without_an_mtp_block_counts_nothing(ferry_bin, tmp_path):
    config = json.loads(SMALL.read_text())
    config.setdefault("text_config", config)["num_nextn_predict_layers"] = 0
    no_block = tmp_path / "config.json"
    no_block.write_text(json.dumps(config))
    base = ["--device-memory", "8GiB", "--host-memory", "30GiB"]
    _, on = plan(ferry_bin, *base, "--mtp", "1", config=no_block)
    _, off = plan(ferry_bin, *base, config=no_block)
    assert on["mtp"] == {"requested": True, "block": False}
    on["mtp"]["requested"] = False
    assert on == off
    r = subprocess.run([ferry_bin, "plan", "--synthetic", str(no_block), *base, "--mtp", "1"],
                       capture_output=True, text=True, timeout=60)
    assert "the model has no MTP block: --mtp has no effect" in r.stdout, r.stdout
