"""S3 objects whose data lives in an erasure-coded pool, round-tripped with boto3.

Environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (from DIR/s3.env) and
OTHER_ENDPOINT_URL (a second gateway of the same cluster). Objects of many sizes (empty, under
one 64-byte shard block, around a stripe of the code, around the gateway's 4 MiB RADOS
stripe, several of those) and a multipart upload whose parts are not stripe-aligned are
written, read back whole through both gateways and in ranges that cross every kind of
boundary, overwritten, copied, tagged (the object meta is compare-and-swapped in an xattr of
the erasure-coded head object) and partly deleted. Prints `live_bytes=N` (the bytes of the
objects left) last; exits non-zero on the first failed check, naming it.
"""
import hashlib
import os

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1", config=cfg)
s3b = boto3.client("s3", endpoint_url=os.environ["OTHER_ENDPOINT_URL"], region_name="us-east-1", config=cfg)
BUCKET = "ecdata"
MIB = 1024 * 1024
STRIPE = 4 * MIB  # the gateway's RADOS object size (kelp_rgw::layout::STRIPE)


def step(name):
    print(f"-- {name}", flush=True)


def etag(body):
    return '"%s"' % hashlib.md5(body).hexdigest()


def check_ranges(key, body, client=s3):
    n = len(body)
    if n == 0:
        return
    spots = {0, 1, 63, 64, 4095, 4096, 8191, n // 2, STRIPE - 1, STRIPE, STRIPE + 1, n - 64, n - 1}
    ranges = [(a, min(n - 1, a + length - 1))
              for a in sorted(s for s in spots if 0 <= s < n) for length in (1, 100, 70_000)]
    ranges.append((min(4095, n - 1), min(n - 1, 4095 + STRIPE + 10)))  # across a RADOS stripe
    for a, b in ranges:
        got = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={a}-{b}")["Body"].read()
        assert got == body[a:b + 1], (key, a, b, len(got))
    got = client.get_object(Bucket=BUCKET, Key=key, Range="bytes=-17")["Body"].read()
    assert got == body[-17:], (key, "suffix")


live = {}

step("bucket")
s3.create_bucket(Bucket=BUCKET)

step("objects of many sizes, read back whole and in ranges through both gateways")
sizes = [0, 1, 63, 64, 100, 4095, 4096, 8193, 65537, MIB + 3, STRIPE - 1, STRIPE, STRIPE + 1,
         2 * STRIPE + 12345]
for size in sizes:
    key = f"size/{size}"
    body = os.urandom(size)
    r = s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    assert r["ETag"] == etag(body), (key, r["ETag"])
    live[key] = body
for key, body in live.items():
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body, key
    assert s3b.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body, key
    h = s3.head_object(Bucket=BUCKET, Key=key)
    assert h["ContentLength"] == len(body) and h["ETag"] == etag(body), key
    check_ranges(key, body, s3 if len(body) % 2 else s3b)

step("multipart upload with parts that end mid-stripe")
key = "multi/video.bin"
parts_data = [os.urandom(5 * MIB + 7), os.urandom(5 * MIB + 4093), os.urandom(MIB + 5)]
up = s3.create_multipart_upload(Bucket=BUCKET, Key=key, ContentType="video/x-test")["UploadId"]
parts = []
for n, data in enumerate(parts_data, start=1):
    client = s3 if n % 2 else s3b  # parts through either gateway
    r = client.upload_part(Bucket=BUCKET, Key=key, UploadId=up, PartNumber=n, Body=data)
    assert r["ETag"] == etag(data), n
    parts.append({"PartNumber": n, "ETag": r["ETag"]})
listed = s3.list_parts(Bucket=BUCKET, Key=key, UploadId=up)["Parts"]
assert [p["Size"] for p in listed] == [len(d) for d in parts_data], listed
done = s3.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=up,
                                    MultipartUpload={"Parts": parts})
want = hashlib.md5(b"".join(hashlib.md5(d).digest() for d in parts_data)).hexdigest()
assert done["ETag"] == f'"{want}-3"', done["ETag"]
whole = b"".join(parts_data)
g = s3b.get_object(Bucket=BUCKET, Key=key)
assert g["Body"].read() == whole and g["ContentType"] == "video/x-test"
check_ranges(key, whole)
# ranges across the part boundaries
edge = len(parts_data[0])
for a, b in [(edge - 10, edge + 10), (edge - 1, edge), (edge + len(parts_data[1]) - 3, len(whole) - 1)]:
    got = s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={a}-{b}")["Body"].read()
    assert got == whole[a:b + 1], (a, b)
live[key] = whole

step("an aborted upload leaves nothing behind")
up = s3.create_multipart_upload(Bucket=BUCKET, Key="multi/aborted")["UploadId"]
s3.upload_part(Bucket=BUCKET, Key="multi/aborted", UploadId=up, PartNumber=1, Body=os.urandom(MIB))
s3.abort_multipart_upload(Bucket=BUCKET, Key="multi/aborted", UploadId=up)
assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []

step("overwrite, copy, tags, delete")
body = os.urandom(STRIPE + 999)
s3.put_object(Bucket=BUCKET, Key="size/100", Body=body)
live["size/100"] = body
assert s3b.get_object(Bucket=BUCKET, Key="size/100")["Body"].read() == body
s3.copy_object(Bucket=BUCKET, Key="copy/of-multi", CopySource={"Bucket": BUCKET, "Key": key})
assert s3.get_object(Bucket=BUCKET, Key="copy/of-multi")["Body"].read() == whole
live["copy/of-multi"] = whole
s3.put_object_tagging(Bucket=BUCKET, Key="size/4096",
                      Tagging={"TagSet": [{"Key": "tier", "Value": "cold"}]})
tags = s3b.get_object_tagging(Bucket=BUCKET, Key="size/4096")["TagSet"]
assert tags == [{"Key": "tier", "Value": "cold"}], tags
assert s3.get_object(Bucket=BUCKET, Key="size/4096")["Body"].read() == live["size/4096"]
for k in ("size/1", f"size/{STRIPE}"):
    s3.delete_object(Bucket=BUCKET, Key=k)
    del live[k]
    try:
        s3.get_object(Bucket=BUCKET, Key=k)
        raise AssertionError(f"{k} still readable after delete")
    except ClientError as e:
        assert e.response["Error"]["Code"] == "NoSuchKey", e

step("listing")
keys = []
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
    keys += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
assert sorted(keys) == sorted((k, len(v)) for k, v in live.items()), keys

print(f"live_bytes={sum(len(v) for v in live.values())}", flush=True)
