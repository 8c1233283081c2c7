#!/usr/bin/env python3
"""Data-parallel step time (issue 10's benchmark rows; DESIGN.md §5: peers in the same run).

`kiln train CONFIG --workers 2` (2 ranks x 1 thread, global batch B, B/2 per rank) against
`kiln train CONFIG` (1 rank x 2 threads, batch B), alternating runs, on the same machine:
  - the median step time of each (metrics.jsonl step_time_ms, steps after the first WARMUP),
    and their ratio;
  - the peak resident memory of each process (the largest rank's for the 2-rank job; from
    getrusage of the waited children);
  - from profiled 2-rank runs (--profile-steps; rank 0's trace), per step: the time the
    communication thread spends in the gradient buckets' all-reduces, the time the step's thread
    waits for them (the "(wait)" kernels), the share hidden behind the backward pass
    (1 - waited / all-reduce), the slowest bucket's wait and the profiled step time; and the same
    with the overlap-collectives pass disabled (a peer in the same run);
  - the same 2-rank job with optimizer.shard_state (ZeRO-1): its median step time, peak resident
    memory, and every rank's optimizer state bytes (run.json; also for the other two runs).
Results are merged into OUT_JSON under "train_step" (bench/out/dist.json, beside dist_bench's
all-reduce rows).

  python3 bench/dist_step_bench.py KILN CONFIG OUT_JSON [--rounds 3] [--prof-rounds 3] [--steps 30] [--set k=v ...]
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
    """The gradient all-reduces of a profiled 2-rank run (rank 0's trace), per profiled step.

    The cpu backend runs each bucket's all-reduce on the executable's communication thread: the
    trace has one "collective" event per bucket on that thread's track (from when the thread began
    it to when it ended) and one "(wait)" kernel per bucket on the step's thread (the time the step
    was blocked until it ended). What the step did not wait for ran behind the backward pass:
      hidden share = 1 - (wait time) / (all-reduce time), per step, summed over the buckets.
    Returns a dict (NaN / 0 where the trace has no such events)."""
    with open(trace_path) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    steps = [e["dur"] / 1e3 for e in events if e.get("cat") == "compute" and e.get("ph") == "X"]
    coll = [e["dur"] / 1e3 for e in events if e.get("cat") == "collective" and e.get("ph") == "X"]
    waits = [e["dur"] / 1e3 for e in events
             if e.get("cat") == "kernel" and e.get("ph") == "X" and
             e.get("name", "").startswith("all_reduce") and e.get("name", "").endswith("(wait)")]
    sync = [e["dur"] / 1e3 for e in events
            if e.get("cat") == "kernel" and e.get("ph") == "X" and
            e.get("name", "").startswith("all_reduce") and e.get("name", "").endswith("(collective)")]
    n = len(steps)
    nan = float("nan")
    r = {"steps": n, "step_ms": statistics.median(steps) if steps else nan,
         "allreduce_ms": nan, "wait_ms": nan, "hidden_share": nan, "slowest_wait_ms": nan,
         "slowest_allreduce_ms": nan, "buckets": 0}
    if n == 0:
        return r
    if coll:  # asynchronous
        total, waited = sum(coll) / n, sum(waits) / n
        r.update(allreduce_ms=total, wait_ms=waited, slowest_allreduce_ms=max(coll),
                 slowest_wait_ms=max(waits) if waits else 0.0, buckets=len(coll) // n,
                 hidden_share=max(0.0, 1.0 - waited / total) if total > 0 else nan)
    elif sync:  # synchronous thunks: the step waits for all of it
        r.update(allreduce_ms=sum(sync) / n, wait_ms=sum(sync) / n, slowest_allreduce_ms=max(sync),
                 slowest_wait_ms=max(sync), buckets=len(sync) // n, hidden_share=0.0)
    return r


def profiled_run(a, sets, env, path, extra_env=None):
    lo, hi = a.warmup + 1, min(a.steps, a.warmup + 10)
    cmd = [a.kiln, "train", a.config, "--output-dir", path, "--workers", "2", "--job-timeout", "600",
           "--profile-steps", "%d:%d" % (lo, hi)] + sets
    rc, _ = run(cmd, dict(env, **(extra_env or {})), path + ".log")
    if rc != 0 or not os.path.exists(os.path.join(path, "trace.json")):
        sys.exit("dist_step_bench: profiled run %s exited %d (log %s.log)" % (" ".join(cmd), rc, path))
    return allreduce_profile(os.path.join(path, "trace.json"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kiln")
    p.add_argument("config")
    p.add_argument("out_json")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--prof-rounds", type=int, default=3)
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
    # Profiled 2-rank runs for the all-reduce share (their own runs: tracing slows the step),
    # alternating: as built (overlap-collectives on), and with that pass disabled, which leaves
    # the memory schedule's order (each all-reduce still asynchronous, but read soon after it
    # starts: a peer for how much the schedule, not the thread, hides).
    prof, prof_off = [], []
    for r in range(a.prof_rounds):
        prof.append(profiled_run(a, sets, env, os.path.join(work, "profiled%d" % r)))
        prof_off.append(profiled_run(a, sets, env, os.path.join(work, "profiled_off%d" % r),
                                     {"KILN_DISABLE_PASSES": "overlap-collectives"}))
        print("profiled round %d: overlap on: %s; overlap-collectives off: %s" %
              (r + 1, json.dumps({k: round(v, 3) for k, v in prof[-1].items()}),
               json.dumps({k: round(v, 3) for k, v in prof_off[-1].items()})), flush=True)

    def med(rows, key):
        vals = [x[key] for x in rows if x[key] == x[key]]
        return round(statistics.median(vals), 4) if vals else float("nan")

    one, dp = statistics.median(one_ms), statistics.median(dp_ms)
    row = {
        "config": a.config, "sets": a.set, "steps": a.steps, "rounds": a.rounds,
        "one_rank_2_threads_ms": round(one, 3), "two_ranks_1_thread_ms": round(dp, 3),
        "two_ranks_over_one": round(dp / one, 4),
        "one_rank_ms_all": [round(x, 3) for x in one_ms], "two_ranks_ms_all": [round(x, 3) for x in dp_ms],
        "one_rank_peak_rss_mib": round(max(one_rss), 1), "two_ranks_peak_rss_mib_per_rank": round(max(dp_rss), 1),
        "profiled_step_ms_rank0": med(prof, "step_ms"),
        "allreduce_ms_per_step_rank0": med(prof, "allreduce_ms"),
        "allreduce_wait_ms_per_step_rank0": med(prof, "wait_ms"),
        "allreduce_hidden_share": med(prof, "hidden_share"),
        "slowest_bucket_wait_ms": med(prof, "slowest_wait_ms"),
        "slowest_bucket_allreduce_ms": med(prof, "slowest_allreduce_ms"),
        "allreduce_buckets_per_step": prof[0]["buckets"],
        "overlap_pass_off": {k: med(prof_off, k) for k in
                             ("step_ms", "allreduce_ms", "wait_ms", "hidden_share", "slowest_wait_ms")},
        "profiled_rounds": [{"on": x, "off": y} for x, y in zip(prof, prof_off)],
        "shard_state_two_ranks_ms": round(statistics.median(ms["zero"]), 3),
        "shard_state_two_ranks_ms_all": [round(x, 3) for x in ms["zero"]],
        "shard_state_peak_rss_mib_per_rank": round(max(rss_of["zero"]), 1),
        "optimizer_state_bytes_per_rank": state_bytes,
        "note": "hidden share = 1 - (rank 0's time in the all_reduce wait thunks) / (its "
                "communication thread's time in the all-reduces), per profiled step, median over "
                "profiled rounds; overlap_pass_off: the same with KILN_DISABLE_PASSES="
                "overlap-collectives; peak RSS is the largest process's VmHWM, "
                "optimizer_state_bytes_per_rank each rank's optimizer state (run.json)",
    }
    print("2 ranks x 1 thread: %.2f ms/step, 1 rank x 2 threads: %.2f ms/step, ratio %.3f; "
          "peak RSS %.0f MiB per rank vs %.0f MiB" % (dp, one, dp / one, max(dp_rss), max(one_rss)))
    print("profiled 2-rank step (rank 0): %.2f ms, %d all-reduce buckets: %.2f ms of all-reduce per "
          "step, %.2f ms of it waited for, hidden %.0f%%; slowest bucket's wait %.2f ms (its "
          "all-reduce %.2f ms)" %
          (row["profiled_step_ms_rank0"], row["allreduce_buckets_per_step"],
           row["allreduce_ms_per_step_rank0"], row["allreduce_wait_ms_per_step_rank0"],
           100 * row["allreduce_hidden_share"], row["slowest_bucket_wait_ms"],
           row["slowest_bucket_allreduce_ms"]))
    off = row["overlap_pass_off"]
    print("  with overlap-collectives disabled: step %.2f ms, all-reduce %.2f ms, waited %.2f ms, "
          "hidden %.0f%%, slowest wait %.2f ms" %
          (off["step_ms"], off["allreduce_ms"], off["wait_ms"], 100 * off["hidden_share"],
           off["slowest_wait_ms"]))
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
