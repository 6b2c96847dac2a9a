#!/usr/bin/env python3
"""read_tfevents.py - an independent reader for keel's TensorBoard event files
(standard library only). Checks the TFRecord framing and both masked CRC32Cs
of every record, decodes Event / Summary protos by field number, and prints
one line per item:  "version <file_version>"  or  "scalar <step> <tag> <value>"
(value as %.9g of the float32). Errors go to stderr with exit status 1.
Usage: read_tfevents.py EVENT_FILE"""
import math
import struct
import sys

from read_common import run


def _make_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ _TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class Bad(Exception):
    pass


def varint(buf, pos):
    shift = 0
    result = 0
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
    """Yield (field_number, wire_type, value) for one message."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise Bad("field number 0")
        if wt == 0:
            val, pos = varint(buf, pos)
        elif wt == 1:
            if pos + 8 > len(buf):
                raise Bad("truncated fixed64")
            val = buf[pos:pos + 8]
            pos += 8
        elif wt == 2:
            n, pos = varint(buf, pos)
            if pos + n > len(buf):
                raise Bad("truncated length-delimited field %d" % num)
            val = buf[pos:pos + n]
            pos += n
        elif wt == 5:
            if pos + 4 > len(buf):
                raise Bad("truncated fixed32")
            val = buf[pos:pos + 4]
            pos += 4
        else:
            raise Bad("unsupported wire type %d (field %d)" % (wt, num))
        yield num, wt, val


def expect(wt, want, what):
    if wt != want:
        raise Bad("%s has wire type %d, expected %d" % (what, wt, want))


def decode_event(data):
    """Event: wall_time=1 double, step=2 int64, file_version=3 string,
    summary=5 Summary { value=1 Value { tag=1 string, simple_value=2 float }}
    (field numbers from tensorflow/core/util/event.proto, summary.proto)"""
    wall_time, step, version, values = None, 0, None, []
    for num, wt, val in fields(data):
        if num == 1:
            expect(wt, 1, "Event.wall_time")
            wall_time = struct.unpack("<d", val)[0]
        elif num == 2:
            expect(wt, 0, "Event.step")
            step = val - (1 << 64) if val >= 1 << 63 else val
        elif num == 3:
            expect(wt, 2, "Event.file_version")
            version = val.decode("utf-8")
        elif num == 5:
            expect(wt, 2, "Event.summary")
            for snum, swt, sval in fields(val):
                if snum != 1:
                    continue
                expect(swt, 2, "Summary.value")
                tag, simple = None, None
                for vnum, vwt, vval in fields(sval):
                    if vnum == 1:
                        expect(vwt, 2, "Value.tag")
                        tag = vval.decode("utf-8")
                    elif vnum == 2:
                        expect(vwt, 5, "Value.simple_value")
                        simple = struct.unpack("<f", vval)[0]
                if tag is None or simple is None:
                    raise Bad("Summary.Value without tag or simple_value")
                values.append((tag, simple))
    if wall_time is None or not math.isfinite(wall_time) or wall_time < 1e9:
        raise Bad("missing or implausible wall_time %r" % (wall_time,))
    return step, version, values


def read(path):
    with open(path, "rb") as f:
        buf = f.read()
    out = []
    pos, index = 0, 0
    while pos < len(buf):
        where = "record %d at offset %d" % (index, pos)
        if len(buf) - pos < 12:
            raise Bad("%s: truncated header" % where)
        head = buf[pos:pos + 8]
        (length,) = struct.unpack("<Q", head)
        (head_crc,) = struct.unpack("<I", buf[pos + 8:pos + 12])
        if masked(crc32c(head)) != head_crc:
            raise Bad("%s: length CRC error" % where)
        if len(buf) - pos - 12 < length + 4:
            raise Bad("%s: truncated data (length %d)" % (where, length))
        data = buf[pos + 12:pos + 12 + length]
        end = pos + 12 + length
        (data_crc,) = struct.unpack("<I", buf[end:end + 4])
        if masked(crc32c(data)) != data_crc:
            raise Bad("%s: data CRC error" % where)
        try:
            step, version, values = decode_event(data)
        except (Bad, UnicodeDecodeError) as e:
            raise Bad("%s: %s" % (where, e))
        if index == 0 and version is None:
            raise Bad("%s: first event has no file_version" % where)
        if version is not None:
            out.append("version %s" % version)
        for tag, value in values:
            out.append("scalar %d %s %.9g" % (step, tag, value))
        pos += 16 + length
        index += 1
    if index == 0:
        raise Bad("no records")
    return out


def main(argv):
    if crc32c(b"123456789") != 0xE3069283:
        sys.stderr.write("read_tfevents: crc32c self-test failed\n")
        return 1
    return run(argv, "read_tfevents", "read_tfevents.py EVENT_FILE", read,
               (Bad, OSError))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
