"""Clients writing and listing one bucket for DURATION seconds while it is resharded.

Writers PUT (and overwrite) keys; a lister pages through the bucket over and over. Checks:
no listing ever shows a key twice or out of order, or misses a key acknowledged before the
listing started; at the end every acknowledged write reads back with its last content and
the final listing is exactly the acknowledged keys. With VERSIONED=1 (a versioned bucket),
every key also has exactly one version per acknowledged write, in order, the newest holding
the last content. Prints the number of writes and listings.
Keys under OTHERS_PREFIX (written by another load generator) count in the listing checks but
not in the final comparison.
Environment: AWS_ENDPOINT_URL and keys (DIR/s3.env), BUCKET, DURATION, VERSIONED, WRITERS,
OTHERS_PREFIX.
"""
import hashlib
import os
import sys
import threading
import time

import boto3
from botocore.config import Config

EP = os.environ["AWS_ENDPOINT_URL"]
BUCKET = os.environ["BUCKET"]
DURATION = float(os.environ.get("DURATION", "20"))
VERSIONED = os.environ.get("VERSIONED") == "1"
WRITERS = int(os.environ.get("WRITERS", "4"))
OTHERS_PREFIX = os.environ.get("OTHERS_PREFIX")
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}, max_pool_connections=16)


def client():
    return boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=cfg)


acked = {}  # key -> (ack time, content md5)
puts = {}  # key -> acknowledged writes, oldest first (version ids)
lock = threading.Lock()
stop = time.time() + DURATION
errors = []
listings = [0]


def writer(t):
    s3 = client()
    i = 0
    while time.time() < stop:
        # mostly new keys, every fifth an overwrite of an earlier one
        n = i if i % 5 else max(0, i - 7)
        key = f"w{t}/{n:06d}"
        body = f"{key} version {i}".encode()
        try:
            r = s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        except Exception as e:  # noqa: BLE001
            errors.append(f"put {key}: {e}")
            return
        with lock:
            acked[key] = (time.time(), hashlib.md5(body).hexdigest())
            puts.setdefault(key, []).append(r.get("VersionId"))
        i += 1


def lister():
    s3 = client()
    while time.time() < stop:
        with lock:
            before = {k for k, (at, _) in acked.items()}
        seen = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, PaginationConfig={"PageSize": 100}):
            seen += [o["Key"] for o in page.get("Contents", [])]
        if len(seen) != len(set(seen)):
            dup = sorted({k for k in seen if seen.count(k) > 1})[:5]
            errors.append(f"listing shows keys twice: {dup}")
            return
        if seen != sorted(seen):
            errors.append("listing out of order")
            return
        missing = before - set(seen)
        if missing:
            errors.append(f"listing misses acknowledged keys: {sorted(missing)[:5]}")
            return
        listings[0] += 1


threads = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)] + [threading.Thread(target=lister)]
for th in threads:
    th.start()
for th in threads:
    th.join()
if errors:
    print("\n".join(errors[:10]), file=sys.stderr)
    sys.exit(1)
s3 = client()
final = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET) for o in p.get("Contents", [])]
if OTHERS_PREFIX:
    final = [k for k in final if not k.startswith(OTHERS_PREFIX)]
assert sorted(final) == sorted(acked), (len(final), len(acked))
for key, (_, md5) in acked.items():
    got = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert hashlib.md5(got).hexdigest() == md5, key
if VERSIONED:
    versions = {}
    for p in s3.get_paginator("list_object_versions").paginate(Bucket=BUCKET):
        for v in p.get("Versions", []) + p.get("DeleteMarkers", []):
            if v["Key"] in acked:
                versions.setdefault(v["Key"], []).append(v["VersionId"])
    for key, ids in puts.items():
        got = versions.get(key, [])
        assert got == ids[::-1], (key, got, ids)
print(f"writes={sum(len(v) for v in puts.values())} keys={len(acked)} listings={listings[0]}")
