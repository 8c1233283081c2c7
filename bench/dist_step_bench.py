#!/usr/bin/env python3
"""Data-parallel step time (issue 10's benchmark rows; DESIGN.md §5: peers in the same run).

`kiln train CONFIG --workers 2` (2 ranks x 1 thread, global batch B, B/2 per rank) against
`kiln train CONFIG` (1 rank x 2 threads, batch B), alternating runs, on the same machine:
  - the median step time of each (metrics.jsonl step_time_ms, steps after the first WARMUP),
    and their ratio;
  - the peak resident memory of each process (the largest rank's for the 2-rank job; from
    getrusage of the waited children);
  - from a profiled 2-rank run (--profile-steps), the time per step rank 0 spends inside the
    all_reduce kernels (the gradient buckets and the loss), the slowest bucket's wait, and how
    much of it overlaps the backward pass (0 while collectives run synchronously in the thunk
    list: the number is measured from the trace, not assumed);
  - the same 2-rank job with optimizer.shard_state (ZeRO-1): its median step time, peak resident
    memory, and every rank's optimizer state bytes (run.json; also for the other two runs).
Results are merged into OUT_JSON under "train_step" (bench/out/dist.json, beside dist_bench's
all-reduce rows).

  python3 bench/dist_step_bench.py KILN CONFIG OUT_JSON [--rounds 3] [--steps 30] [--set k=v ...]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(cmd, env, log):
    """Runs cmd; returns (exit code, peak RSS in MiB of its largest descendant)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=900).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: only a new maximum is visible.
    return rc, (after if after > before else float("nan")) / 1024.0


def step_times(out_dir, warmup):
    times = []
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "step_time_ms" in m and m.get("step", 0) > warmup:
                times.append(m["step_time_ms"])
    return times


def allreduce_profile(trace_path):
    """(all_reduce ms per step, the slowest all_reduce's ms, all_reduce kernels per step)."""
    with open(trace_path) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    steps = sum(1 for e in events if e.get("cat") == "compute")  # one per profiled step
    ar = [e["dur"] / 1e3 for e in events
          if e.get("ph") == "X" and e.get("name", "").startswith("all_reduce")]
    if steps == 0 or not ar:
        return float("nan"), float("nan"), 0
    return sum(ar) / steps, max(ar), len(ar) // steps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kiln")
    p.add_argument("config")
    p.add_argument("out_json")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--set", action="append", default=[])
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="kiln-dist-step-")
    sets = []
    for kv in ["steps=%d" % a.steps, "log_every=1", "eval_every=0", "checkpoint_every=0"] + a.set:
        sets += ["--set", kv]
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    one_env = dict(env, OMP_NUM_THREADS="2")
    names = ("one", "dp", "zero")  # zero: 2 ranks with optimizer.shard_state (ZeRO-1)
    ms = {n: [] for n in names}
    rss_of = {n: [] for n in names}
    state_bytes = {}
    for r in range(a.rounds):
        for name in names:
            out = os.path.join(work, "%s%d" % (name, r))
            cmd = [a.kiln, "train", a.config, "--output-dir", out] + sets
            if name != "one":
                cmd += ["--workers", "2", "--job-timeout", "600"]
            if name == "zero":
                cmd += ["--set", "optimizer.shard_state=true"]
            rc, rss = run(cmd, one_env if name == "one" else env, out + ".log")
            if rc != 0:
                sys.exit("dist_step_bench: %s exited %d (log %s.log)" % (" ".join(cmd), rc, out))
            med = statistics.median(step_times(out, a.warmup))
            ms[name].append(med)
            rss_of[name].append(rss)
            with open(os.path.join(out, "run.json")) as f:
                state_bytes[name] = [x.get("optimizer_state_bytes") for x in json.load(f)["ranks"]]
            print("round %d %-4s median step %.2f ms, peak RSS %.0f MiB, optimizer state bytes per rank %s" %
                  (r + 1, name, med, rss, state_bytes[name]), flush=True)
    one_ms, dp_ms, one_rss, dp_rss = ms["one"], ms["dp"], rss_of["one"], rss_of["dp"]
    # One profiled 2-rank run for the all_reduce share (its own run: tracing slows the step).
    prof = os.path.join(work, "profiled")
    lo, hi = a.warmup + 1, min(a.steps, a.warmup + 5)
    cmd = [a.kiln, "train", a.config, "--output-dir", prof, "--workers", "2", "--job-timeout", "600",
           "--profile-steps", "%d:%d" % (lo, hi)] + sets
    rc, _ = run(cmd, env, prof + ".log")
    ar_ms, slowest_ms, per_step = (float("nan"),) * 3
    if rc == 0 and os.path.exists(os.path.join(prof, "trace.json")):
        ar_ms, slowest_ms, per_step = allreduce_profile(os.path.join(prof, "trace.json"))
    one, dp = statistics.median(one_ms), statistics.median(dp_ms)
    row = {
        "config": a.config, "sets": a.set, "steps": a.steps, "rounds": a.rounds,
        "one_rank_2_threads_ms": round(one, 3), "two_ranks_1_thread_ms": round(dp, 3),
        "two_ranks_over_one": round(dp / one, 4),
        "one_rank_ms_all": [round(x, 3) for x in one_ms], "two_ranks_ms_all": [round(x, 3) for x in dp_ms],
        "one_rank_peak_rss_mib": round(max(one_rss), 1), "two_ranks_peak_rss_mib_per_rank": round(max(dp_rss), 1),
        "allreduce_ms_per_step_rank0": round(ar_ms, 3), "allreduce_kernels_per_step": per_step,
        "slowest_allreduce_ms": round(slowest_ms, 3),
        "allreduce_hidden_share": 0.0,
        "shard_state_two_ranks_ms": round(statistics.median(ms["zero"]), 3),
        "shard_state_two_ranks_ms_all": [round(x, 3) for x in ms["zero"]],
        "shard_state_peak_rss_mib_per_rank": round(max(rss_of["zero"]), 1),
        "optimizer_state_bytes_per_rank": state_bytes,
        "note": "collectives run synchronously in the thunk list: none of the all-reduce overlaps "
                "the backward pass yet (hidden share 0); peak RSS is the largest process's VmHWM, "
                "optimizer_state_bytes_per_rank each rank's optimizer state (run.json)",
    }
    print("2 ranks x 1 thread: %.2f ms/step, 1 rank x 2 threads: %.2f ms/step, ratio %.3f; "
          "peak RSS %.0f MiB per rank vs %.0f MiB; all_reduce %.2f ms/step on rank 0 "
          "(%s kernels, slowest %.2f ms), hidden 0%%" %
          (dp, one, dp / one, max(dp_rss), max(one_rss), ar_ms, per_step, slowest_ms))
    print("shard_state (ZeRO-1), 2 ranks: %.2f ms/step, peak RSS %.0f MiB per rank; optimizer state "
          "bytes per rank: one process %s, 2 ranks %s, 2 ranks with shard_state %s" %
          (row["shard_state_two_ranks_ms"], max(rss_of["zero"]), state_bytes["one"], state_bytes["dp"],
           state_bytes["zero"]))
    data = {}
    if os.path.exists(a.out_json):
        with open(a.out_json) as f:
            data = json.load(f)
    data.setdefault("train_step", [])
    data["train_step"] = [x for x in data["train_step"] if x.get("config") != a.config] + [row]
    with open(a.out_json, "w") as f:
        json.dump(data, f, indent=2)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
