#!/usr/bin/env python3
"""Checks TensorBoard event files (and plain TFRecord files) without TensorFlow.

Usage:
  tools/check_events.py RUN_DIR_OR_FILE... [--raw] [--allow-truncated-tail] [--quiet]

For each file (a directory means every file in it whose name contains "tfevents"), verifies the
TFRecord framing record by record -- u64 LE length, u32 LE masked CRC32C of the 8 length bytes,
data, u32 LE masked CRC32C of the data -- then decodes each record as a TensorBoard `Event`
protobuf and prints one JSON object per record:

  {"file": ..., "offset": 0, "wall_time": 1700000000.5, "step": 0, "file_version": "brain.Event:2"}
  {"file": ..., "offset": 40, "wall_time": ..., "step": 10,
   "summary": [{"tag": "loss", "simple_value": 0.25}]}

Event files must start with a file_version event ("brain.Event:..."). Fields Kiln does not write
are decoded generically (varint / fixed64 / fixed32 / length-delimited) under "unknown".
--raw checks only the framing and prints each record's length and bytes (hex), for any TFRecord
file (e.g. data shards).

Exit status: 0 when every record is well formed; 1 on the first malformed record (CRC mismatch,
bad protobuf, wrong wire type for a known field, truncated record unless
--allow-truncated-tail), with a message naming the file and byte offset on stderr; 2 when a file
cannot be read or nothing matched; 141 when stdout is closed early (`| head`), without a traceback.
Standard library only.
"""

import argparse
import json
import os
import struct
import sys

# ---- CRC32C (Castagnoli, reflected polynomial 0x82F63B78) ----

_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data: bytes, crc: int = 0) -> int:
    crc ^= 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class Malformed(Exception):
    pass


class Truncated(Malformed):
    pass


# ---- TFRecord framing ----


def read_records(data: bytes, allow_truncated_tail: bool):
    """Yields (offset, record bytes); raises Malformed / Truncated naming the byte offset."""
    pos = 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise Truncated(f"truncated record at offset {pos} ({len(data) - pos} of 12 header bytes)")
        (length,) = struct.unpack_from("<Q", data, pos)
        (len_crc,) = struct.unpack_from("<I", data, pos + 8)
        if masked_crc32c(data[pos:pos + 8]) != len_crc:
            raise Malformed(f"length CRC mismatch at offset {pos}")
        end = pos + 12 + length + 4
        if end > len(data):
            raise Truncated(f"truncated record at offset {pos} (needs {12 + length + 4} bytes, "
                            f"file has {len(data) - pos})")
        body = data[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        if masked_crc32c(body) != data_crc:
            raise Malformed(f"data CRC mismatch at offset {pos} ({length} bytes)")
        yield pos, body
        pos = end


# ---- protobuf wire format ----

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


def _varint(buf: bytes, pos: int):
    result = 0
    for shift in range(0, 70, 7):
        if pos >= len(buf):
            raise Malformed("varint runs past the end")
        b = buf[pos]
        pos += 1
        if shift == 63 and b > 1:
            raise Malformed("varint overflows 64 bits")
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
    raise Malformed("varint longer than 10 bytes")


def parse_fields(buf: bytes):
    """Returns [(field number, wire type, value)]: int for varint, bytes for the others."""
    out = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise Malformed("field number 0")
        if wire == VARINT:
            value, pos = _varint(buf, pos)
        elif wire == FIXED64:
            if pos + 8 > len(buf):
                raise Malformed(f"fixed64 field {field} runs past the end")
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == FIXED32:
            if pos + 4 > len(buf):
                raise Malformed(f"fixed32 field {field} runs past the end")
            value, pos = buf[pos:pos + 4], pos + 4
        elif wire == LEN:
            n, pos = _varint(buf, pos)
            if pos + n > len(buf):
                raise Malformed(f"length-delimited field {field} runs past the end")
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise Malformed(f"unsupported wire type {wire} (field {field})")
        out.append((field, wire, value))
    return out


def generic(wire: int, value):
    if wire == VARINT:
        return value
    if wire == FIXED64:
        return {"fixed64": struct.unpack("<Q", value)[0], "double": struct.unpack("<d", value)[0]}
    if wire == FIXED32:
        return {"fixed32": struct.unpack("<I", value)[0], "float": struct.unpack("<f", value)[0]}
    try:
        return {"string": value.decode("utf-8")}
    except UnicodeDecodeError:
        return {"bytes_hex": value.hex()}


def _expect(name: str, wire: int, want: int):
    if wire != want:
        raise Malformed(f"{name} has wire type {wire}, expected {want}")


def _string(name: str, value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed(f"{name} is not valid UTF-8")


def _finite(x: float):
    # JSON has no NaN/inf: spell them as strings so the output stays strict JSON.
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def decode_value(buf: bytes):
    v = {}
    for field, wire, value in parse_fields(buf):
        if field == 1:
            _expect("Value.tag", wire, LEN)
            v["tag"] = _string("Value.tag", value)
        elif field == 2:
            _expect("Value.simple_value", wire, FIXED32)
            v["simple_value"] = _finite(struct.unpack("<f", value)[0])
        else:
            v.setdefault("unknown", {})[str(field)] = generic(wire, value)
    return v


def decode_event(buf: bytes):
    ev = {}
    for field, wire, value in parse_fields(buf):
        if field == 1:
            _expect("Event.wall_time", wire, FIXED64)
            ev["wall_time"] = _finite(struct.unpack("<d", value)[0])
        elif field == 2:
            _expect("Event.step", wire, VARINT)
            ev["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif field == 3:
            _expect("Event.file_version", wire, LEN)
            ev["file_version"] = _string("Event.file_version", value)
        elif field == 5:
            _expect("Event.summary", wire, LEN)
            values = []
            for f2, w2, v2 in parse_fields(value):
                if f2 == 1:
                    _expect("Summary.value", w2, LEN)
                    values.append(decode_value(v2))
                else:
                    ev.setdefault("unknown", {})[f"summary.{f2}"] = generic(w2, v2)
            ev["summary"] = values
        elif field == 7:
            _expect("Event.session_log", wire, LEN)
            log = {}
            for f2, w2, v2 in parse_fields(value):
                if f2 == 1:
                    _expect("SessionLog.status", w2, VARINT)
                    log["status"] = {0: "STATUS_UNSPECIFIED", 1: "START", 2: "STOP",
                                     3: "CHECKPOINT"}.get(v2, v2)
                elif f2 in (2, 3):
                    log["checkpoint_path" if f2 == 2 else "msg"] = _string("SessionLog", v2)
                else:
                    log[str(f2)] = generic(w2, v2)
            ev["session_log"] = log
        else:
            ev.setdefault("unknown", {})[str(field)] = generic(wire, value)
    ev.setdefault("wall_time", 0.0)
    ev.setdefault("step", 0)
    return ev


# ---- driver ----


def check_file(path: str, raw: bool, allow_truncated_tail: bool, quiet: bool) -> int:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        print(f"{path}: cannot read: {e}", file=sys.stderr)
        return 2
    count = 0
    offset = 0
    try:
        for offset, body in read_records(data, allow_truncated_tail):
            if raw:
                row = {"file": path, "offset": offset, "length": len(body), "data_hex": body.hex()}
            else:
                try:
                    ev = decode_event(body)
                except Malformed as e:
                    raise Malformed(f"bad Event protobuf in record at offset {offset}: {e}")
                if count == 0 and not str(ev.get("file_version", "")).startswith("brain.Event:"):
                    raise Malformed("first record is not a file_version event (brain.Event:N)")
                row = {"file": path, "offset": offset, **ev}
            count += 1
            if not quiet:
                print(json.dumps(row, allow_nan=False))
    except Truncated as e:
        if not allow_truncated_tail:
            print(f"{path}: {e}", file=sys.stderr)
            return 1
        print(f"{path}: ignoring {e}", file=sys.stderr)
    except Malformed as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    if not raw and count == 0:
        print(f"{path}: empty event file (no file_version record)", file=sys.stderr)
        return 1
    print(f"{path}: OK, {count} records", file=sys.stderr)
    return 0


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="event files or directories")
    ap.add_argument("--raw", action="store_true", help="check TFRecord framing only")
    ap.add_argument("--allow-truncated-tail", action="store_true",
                    help="accept a file whose last record is incomplete (a live writer)")
    ap.add_argument("--quiet", action="store_true", help="print no records, only the verdict")
    args = ap.parse_args(argv)
    files = []
    for p in args.paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, n) for n in os.listdir(p) if "tfevents" in n)
        else:
            files.append(p)
    if not files:
        print("no event files found", file=sys.stderr)
        return 2
    status = 0
    for path in files:
        status = max(status, check_file(path, args.raw, args.allow_truncated_tail, args.quiet))
    return status


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`check_events.py DIR | head`): stop quietly, as grep or cat would.
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + 13  # what a shell reports for a process ended by SIGPIPE
    sys.exit(code)
