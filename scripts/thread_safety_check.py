#!/usr/bin/env python3
"""Clang's thread-safety analysis over the sources whose classes annotate their locking.

Members that say which mutex guards them (ABSL_GUARDED_BY, kiln/base/mutex.h) are checked by
`clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety`, with each file's own flags from the
build's compile_commands.json (the build itself may use GCC, which ignores the annotations).
CTest runs it as `thread_safety_lint` (label lint; src/kiln/CMakeLists.txt lists the files).

  scripts/thread_safety_check.py --db build/compile_commands.json --clang clang++-14 \
      src/kiln/serve/batcher.cc src/kiln/http/http_server.cc

Exits 0 when every file passes, 1 naming each file that does not (with clang's messages), 2 for
a file the database does not build.
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys

# Accepted by GCC, not by clang, or meaningless without code generation.
EXTRA = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
         "-Wno-unknown-warning-option", "-Wno-ignored-optimization-argument",
         "-Wno-unused-command-line-argument"]


def clang_command(entry, clang):
    """The entry's compile command with clang, no output file, syntax only."""
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = [clang]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c" or a.startswith("-fvect-cost-model") or a.startswith("-fno-semantic"):
            continue
        out.append(a)
    return out + EXTRA


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True, help="compile_commands.json")
    p.add_argument("--clang", default="clang++")
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    with open(a.db) as f:
        db = json.load(f)
    by_file = {}
    for e in db:
        path = os.path.realpath(os.path.join(e["directory"], e["file"]))
        by_file.setdefault(path, []).append(e)
    # A file's plain build, not its sanitizer build (kiln_serve_asan compiles serve again).
    for path, entries in by_file.items():
        plain = [e for e in entries if "asan" not in e.get("output", e.get("command", ""))]
        by_file[path] = (plain or entries)[0]
    jobs = []
    for name in a.files:
        path = os.path.realpath(name)
        if path not in by_file:
            print(f"thread_safety_check: {name} is not in {a.db} (not built?)", file=sys.stderr)
            return 2
        jobs.append((name, by_file[path]))

    def run(job):
        name, e = job
        r = subprocess.run(clang_command(e, a.clang), cwd=e["directory"], capture_output=True,
                           text=True)
        return name, r.returncode, r.stderr

    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for name, rc, err in pool.map(run, jobs):
            if rc != 0:
                failed.append(name)
                sys.stderr.write(err)
    for name in failed:
        print(f"thread_safety_check: {name}: fails clang's -Wthread-safety", file=sys.stderr)
    if not failed:
        print(f"thread_safety_check: {len(jobs)} files pass clang -Wthread-safety")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
