#!/usr/bin/env python3
"""tb_check.py EVENTS METRICS.jsonl: reads a TensorBoard event file with protobuf (Debian's
python3-protobuf), independently of the C writer, and checks it against the metrics file of the
same run.

Every record's two CRCs are recomputed here (CRC-32C written in Python, masked as TensorFlow
masks them); the Event and Summary messages are built at run time from a descriptor made in this
script (tensorflow/core/util/event.proto and summary.proto, the fields TensorBoard reads), not
from generated code. The first event must carry file_version "brain.Event:2"; then one event per
metrics line, in order, with its step, its time (to the metrics' millisecond) and, under
"<kind>/<key>", every figure the line has that is not null (none that it lacks), each equal to
the line's value as a 32-bit float, to the digits the line prints. Prints "tb check: ok (N
events)" or the first difference and exits 1.
"""
import json
import math
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool

try:
    from google.protobuf.message_factory import GetMessageClass
except ImportError:  # protobuf before 4.21
    from google.protobuf import message_factory

    def GetMessageClass(desc):
        return message_factory.MessageFactory(desc.file.pool).GetPrototype(desc)


def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    return table


CRC_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    f = descriptor_pb2.FileDescriptorProto(name="tb_check.proto", package="tbcheck")
    F = descriptor_pb2.FieldDescriptorProto

    def add(msg, name, number, ftype, label=F.LABEL_OPTIONAL, type_name=None):
        fd = msg.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            fd.type_name = type_name

    value = f.message_type.add(name="SummaryValue")
    add(value, "tag", 1, F.TYPE_STRING)
    add(value, "simple_value", 2, F.TYPE_FLOAT)
    summary = f.message_type.add(name="Summary")
    add(summary, "value", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".tbcheck.SummaryValue")
    event = f.message_type.add(name="Event")
    add(event, "wall_time", 1, F.TYPE_DOUBLE)
    add(event, "step", 2, F.TYPE_INT64)
    add(event, "file_version", 3, F.TYPE_STRING)
    add(event, "summary", 5, F.TYPE_MESSAGE, type_name=".tbcheck.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return GetMessageClass(pool.FindMessageTypeByName("tbcheck.Event"))


def records(path):
    data = open(path, "rb").read()
    pos, n = 0, 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise ValueError(f"record {n}: {len(data) - pos} bytes left, cut short")
        head = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", head)
        (crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        if crc != masked(crc32c(head)):
            raise ValueError(f"record {n}: the CRC of its length does not match")
        body = data[pos + 12 : pos + 12 + length]
        if len(body) != length or len(data) < pos + 16 + length:
            raise ValueError(f"record {n}: cut short")
        (crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        if crc != masked(crc32c(body)):
            raise ValueError(f"record {n}: the CRC of its data does not match")
        yield body
        pos += 16 + length
        n += 1


# the metrics' keys by kind, their tags, and the absolute error of the digits the line prints
EVAL_KEYS = {"eval_loss": "loss", "eval_ppl": "ppl", "eval_batches": "batches",
             "eval_tokens": "tokens", "eval_secs": "secs"}
STEP_KEYS = ["loss", "lr", "grad_norm", "tokens_per_s", "flops_per_s", "mfu", "peak_bytes",
             "peak_bytes_min", "secs"]
PRINTED = {"loss": 5e-7, "secs": 5e-7, "mfu": 5e-5, "tokens_per_s": 0.05, "eval_loss": 5e-7,
           "eval_secs": 5e-7}


def expected(line):
    kind = line["kind"]
    keys = EVAL_KEYS if kind == "eval" else {k: k for k in STEP_KEYS}
    out = {}
    for key, tag in keys.items():
        v = line.get(key)
        if v is not None:
            out[f"{kind}/{tag}"] = (key, float(v))
    return out


def main():
    assert crc32c(b"123456789") == 0xE3069283, "the CRC-32C check value"
    Event = event_class()
    events = []
    for body in records(sys.argv[1]):
        e = Event()
        e.ParseFromString(body)
        events.append(e)
    lines = [json.loads(s) for s in open(sys.argv[2]) if s.strip()]
    if not events or events[0].file_version != "brain.Event:2" or events[0].HasField("summary"):
        raise ValueError('the first event is not file_version "brain.Event:2" alone')
    if len(events) - 1 != len(lines):
        raise ValueError(f"{len(events) - 1} events after the first, {len(lines)} metrics lines")
    for i, (e, line) in enumerate(zip(events[1:], lines)):
        where = f"event {i + 1} (step {line['step']}, {line['kind']})"
        if e.step != line["step"]:
            raise ValueError(f"{where}: step {e.step}")
        if abs(e.wall_time - line["time"]) > 6e-4:
            raise ValueError(f"{where}: wall_time {e.wall_time}, the metrics' time {line['time']}")
        got = {v.tag: v.simple_value for v in e.summary.value}
        want = expected(line)
        if set(got) != set(want):
            raise ValueError(f"{where}: tags {sorted(got)}, want {sorted(want)}")
        for tag, (key, v) in want.items():
            f32 = struct.unpack("<f", struct.pack("<f", v))[0]
            tol = PRINTED.get(key, 0.0) + 6e-6 * abs(v)
            if not math.isfinite(got[tag]) or abs(got[tag] - f32) > tol:
                raise ValueError(f"{where}: {tag} = {got[tag]!r}, the metrics' {key} = {v!r}")
    print(f"tb check: ok ({len(events)} events)")


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:
        print(f"tb check: {sys.argv[1]}: {err}")
        sys.exit(1)
