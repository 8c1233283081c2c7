#!/usr/bin/env python3
"""An independent reader of the datasets `kiln data import` writes (docs/formats.md).

Standard-library Python only, sharing no code with Kiln: its own CRC32C, TFRecord framing and
protobuf wire-format decoder of tf.train.Example. It checks, for each DIR given:
  - dataset.json: format kiln.dataset.v1, the shards' sizes and whole-file CRC32C;
  - every record's length and data CRCs (masked, as TFRecord stores them);
  - every record parses as a tf.train.Example holding each schema feature with its list kind
    and element count, and the record count of each shard;
  - --expect-pixels SRC: for an image dataset imported at the source's own size with --resize
    fit, each record's pixels equal the source PNG's (decoded here with zlib).
Exit status 0 when everything holds, 1 with a message naming the file and offset otherwise.

  check_dataset.py /data/icons /data/clicks
  check_dataset.py --make-pngs /tmp/src [W H PER_LABEL]   # a class-folder tree of PNGs
"""
import json
import os
import struct
import sys
import zlib

_POLY = 0x82F63B78
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class Bad(Exception):
    pass


def varint(buf, pos):
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise Bad("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise Bad("varint too long")


def fields(buf):
    """Yields (field number, wire type, value) of one message."""
    pos = 0
    while pos < len(buf):
        tag, pos = varint(buf, pos)
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            v, pos = varint(buf, pos)
        elif wt == 1:
            v, pos = buf[pos:pos + 8], pos + 8
        elif wt == 2:
            n, pos = varint(buf, pos)
            if pos + n > len(buf):
                raise Bad("length past the end of the message")
            v, pos = buf[pos:pos + n], pos + n
        elif wt == 5:
            v, pos = buf[pos:pos + 4], pos + 4
        else:
            raise Bad("wire type %d" % wt)
        yield num, wt, v


def decode_feature(buf):
    kind, values = None, []
    for num, wt, v in fields(buf):
        if num not in (1, 2, 3):
            continue
        k = {1: "bytes", 2: "float", 3: "int64"}[num]
        if k != kind:
            kind, values = k, []
        for n2, w2, x in fields(v):
            if n2 != 1:
                continue
            if k == "bytes":
                values.append(bytes(x))
            elif k == "float":
                if w2 == 5:
                    values.append(struct.unpack("<f", x)[0])
                else:
                    values.extend(struct.unpack("<%df" % (len(x) // 4), x))
            else:
                if w2 == 0:
                    values.append(x - (1 << 64) if x >= 1 << 63 else x)
                else:
                    p = 0
                    while p < len(x):
                        y, p = varint(x, p)
                        values.append(y - (1 << 64) if y >= 1 << 63 else y)
    return kind, values


def decode_example(buf):
    feats = {}
    for num, wt, v in fields(buf):
        if num != 1 or wt != 2:
            continue
        for n2, w2, entry in fields(v):
            if n2 != 1:
                continue
            key, val = b"", (None, [])
            for n3, w3, x in fields(entry):
                if n3 == 1:
                    key = bytes(x)
                elif n3 == 2:
                    val = decode_feature(x)
            feats[key.decode()] = val
    return feats


def records(path):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise Bad("%s: truncated record header at offset %d" % (path, pos))
        (length,) = struct.unpack_from("<Q", data, pos)
        (lcrc,) = struct.unpack_from("<I", data, pos + 8)
        if lcrc != masked(crc32c(data[pos:pos + 8])):
            raise Bad("%s: length CRC mismatch at offset %d" % (path, pos))
        end = pos + 12 + length
        if end + 4 > len(data):
            raise Bad("%s: truncated record at offset %d" % (path, pos))
        payload = data[pos + 12:end]
        (dcrc,) = struct.unpack_from("<I", data, end)
        if dcrc != masked(crc32c(payload)):
            raise Bad("%s: data CRC mismatch at offset %d" % (path, pos))
        yield pos, payload
        pos = end + 4


KINDS = {"uint8": "bytes", "string": "bytes", "float32": "float", "int64": "int64"}


def read_png(path):
    """8-bit gray/RGB/RGBA non-interlaced PNGs (what --make-pngs writes): (w, h, ch, bytes)."""
    data = open(path, "rb").read()
    pos, idat, w = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        typ, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if typ == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", body[:10])
            ch = {0: 1, 2: 3, 6: 4}[color]
        elif typ == b"IDAT":
            idat += body
        pos += 12 + n
    raw, out, stride = zlib.decompress(idat), bytearray(), w * ch
    prev = bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f != 0:
            raise Bad("%s: filter type %d not supported here" % (path, f))
        out += line
        prev = line
    return w, h, ch, bytes(out)


def expected_pixels(w, h, ch, px, channels, background=255):
    out = bytearray()
    for i in range(w * h):
        p = px[i * ch:(i + 1) * ch]
        rgb = [p[0]] * 3 if ch in (1, 2) else list(p[:3])
        if ch in (2, 4):
            a = p[-1]
            rgb = [(v * a + background * (255 - a) + 127) // 255 for v in rgb]
        out += bytes([(299 * rgb[0] + 587 * rgb[1] + 114 * rgb[2] + 500) // 1000]) if channels == 1 else bytes(rgb)
    return bytes(out)


def check(d, pixels_src=None):
    m = json.load(open(os.path.join(d, "dataset.json")))
    if m.get("format") != "kiln.dataset.v1":
        raise Bad("%s/dataset.json: format %r" % (d, m.get("format")))
    schema = {f["name"]: f for f in m["features"]}
    total = 0
    for s in m["shards"]:
        path = os.path.join(d, s["file"])
        data = open(path, "rb").read()
        if len(data) != s["bytes"] or "%08x" % crc32c(data) != s["crc32c"]:
            raise Bad("%s: size or CRC32C differs from dataset.json" % path)
        n = 0
        for off, payload in records(path):
            try:
                ex = decode_example(payload)
            except Bad as e:
                raise Bad("%s record at offset %d: %s" % (path, off, e))
            for name, f in schema.items():
                kind, vals = ex.get(name, (None, []))
                count = 1
                for dim in f["shape"]:
                    count *= dim
                got = len(vals[0]) if f["dtype"] == "uint8" and vals else len(vals)
                if kind != KINDS[f["dtype"]] or got != count:
                    raise Bad("%s record at offset %d: feature %s is %s x %d, schema %s %s"
                              % (path, off, name, kind, got, f["dtype"], f["shape"]))
            if pixels_src is not None:
                rel = ex["path"][1][0].decode()
                w, h, ch, px = read_png(os.path.join(pixels_src, rel))
                want = expected_pixels(w, h, ch, px, schema["image"]["shape"][2])
                if ex["image"][1][0] != want:
                    raise Bad("%s record at offset %d: pixels of %s differ from the source" % (path, off, rel))
            n += 1
        if n != s["examples"]:
            raise Bad("%s: %d records, dataset.json says %d" % (path, n, s["examples"]))
        total += n
    return "%s: %d shards, %d records OK (%s)" % (d, len(m["shards"]), total, m["kind"])


def write_png(path, w, h, ch, px):
    color = {1: 0, 3: 2, 4: 6}[ch]
    raw = b"".join(b"\0" + px[y * w * ch:(y + 1) * w * ch] for y in range(h))

    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def make_pngs(root, w=8, h=6, per_label=6):
    for label, ch in (("gray", 1), ("rgb", 3), ("rgba", 4)):
        os.makedirs(os.path.join(root, label), exist_ok=True)
        for k in range(per_label):
            # Rows of one pattern, shifted per row and per image (fast for big images too).
            base = bytes((i * 7 + k * 31 + (i % ch) * 50) % 256 for i in range(w * ch + h * ch))
            px = b"".join(base[(y * ch) % len(base):][:w * ch].ljust(w * ch, b"\x80") for y in range(h))
            write_png(os.path.join(root, label, "%s%d.png" % (label, k)), w, h, ch, px)


def main(argv):
    if len(argv) in (3, 6) and argv[1] == "--make-pngs":
        make_pngs(argv[2], *[int(a) for a in argv[3:]])
        return 0
    src, dirs = None, []
    it = iter(argv[1:])
    for a in it:
        if a == "--expect-pixels":
            src = next(it)
        else:
            dirs.append(a)
    if not dirs:
        print(__doc__)
        return 2
    try:
        for d in dirs:
            kind = json.load(open(os.path.join(d, "dataset.json"))).get("kind")
            print(check(d, src if kind == "images" else None))
    except (Bad, OSError, KeyError, ValueError) as e:
        print("check_dataset: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
