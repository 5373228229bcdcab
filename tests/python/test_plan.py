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
    """Past --kv-resident the device keeps the window, the host every slot's rows (int8: 516 bytes a
    row, 11 DSA layers); a --kv-host-budget that cannot hold them is a problem naming budget and need."""
    args = ["--device-memory", "139GiB", "--host-memory", "200GiB", "--ctx", "131072", "--slots", "3"]
    code, p = plan(ferry_bin, *args, "--kv-resident", "0")
    assert p["host"]["kv_bytes"] == 0 and p["kv_resident"] == 0
    all_on_device = sum(s["device_kv_bytes"] for s in p["stages"])
    code, p = plan(ferry_bin, *args)  # the default window, 32768 rows
    need = 3 * 131072 * 11 * 516
    assert p["kv_resident"] == 32768 and p["host"]["kv_bytes"] == need, p["host"]
    assert sum(s["host_kv_bytes"] for s in p["stages"]) == need
    assert all_on_device - sum(s["device_kv_bytes"] for s in p["stages"]) == 3 * (131072 - 32768) * 11 * 516
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
