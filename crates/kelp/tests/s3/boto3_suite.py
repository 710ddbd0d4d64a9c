"""S3 conformance checks run with boto3 against a Kelp gateway.

Environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (from DIR/s3.env),
and OTHER_ENDPOINT_URL (a second gateway on the same cluster). Exits non-zero on the first
failed check, naming it.
"""
import hashlib
import io
import os
import sys
import time
import urllib.request

import boto3
import botocore
from botocore.config import Config
from botocore.exceptions import ClientError

EP = os.environ["AWS_ENDPOINT_URL"]
OTHER = os.environ["OTHER_ENDPOINT_URL"]
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
s3 = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=cfg)
s3b = boto3.client("s3", endpoint_url=OTHER, region_name="us-east-1", config=cfg)


def expect_error(code, fn, *a, **kw):
    try:
        fn(*a, **kw)
    except ClientError as e:
        got = e.response["Error"]["Code"]
        assert got == code, f"expected {code}, got {got}: {e}"
        return e
    raise AssertionError(f"expected {code}, call succeeded")


def step(name):
    print(f"-- {name}", flush=True)


step("buckets")
s3.create_bucket(Bucket="alpha")
expect_error("BucketAlreadyOwnedByYou", s3.create_bucket, Bucket="alpha")
expect_error("InvalidBucketName", s3.create_bucket, Bucket="Bad_Name")
names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
assert "alpha" in names, names
s3.head_bucket(Bucket="alpha")
expect_error("404", s3.head_bucket, Bucket="nope-bucket")
expect_error("NoSuchBucket", s3.list_objects_v2, Bucket="nope-bucket")
assert s3.get_bucket_location(Bucket="alpha").get("LocationConstraint") in (None, "")

step("put/get/head with metadata")
body = os.urandom(100_000)
r = s3.put_object(Bucket="alpha", Key="dir/one.bin", Body=body, ContentType="application/x-test",
                  Metadata={"color": "blue"}, CacheControl="max-age=60")
md5 = hashlib.md5(body).hexdigest()
assert r["ETag"] == f'"{md5}"', r["ETag"]
g = s3.get_object(Bucket="alpha", Key="dir/one.bin")
assert g["Body"].read() == body
assert g["ContentType"] == "application/x-test"
assert g["Metadata"] == {"color": "blue"}, g["Metadata"]
assert g["CacheControl"] == "max-age=60"
h = s3.head_object(Bucket="alpha", Key="dir/one.bin")
assert h["ContentLength"] == len(body) and h["ETag"] == f'"{md5}"'
expect_error("NoSuchKey", s3.get_object, Bucket="alpha", Key="missing")
expect_error("404", s3.head_object, Bucket="alpha", Key="missing")

step("the other gateway sees the same object")
assert s3b.get_object(Bucket="alpha", Key="dir/one.bin")["Body"].read() == body

step("ranges")
assert s3.get_object(Bucket="alpha", Key="dir/one.bin", Range="bytes=10-19")["Body"].read() == body[10:20]
assert s3.get_object(Bucket="alpha", Key="dir/one.bin", Range="bytes=-5")["Body"].read() == body[-5:]
assert s3.get_object(Bucket="alpha", Key="dir/one.bin", Range="bytes=99990-")["Body"].read() == body[99990:]
expect_error("InvalidRange", s3.get_object, Bucket="alpha", Key="dir/one.bin", Range="bytes=200000-")

step("a single PUT of several stripes, read whole and across stripe and read-piece boundaries")
big = os.urandom(9 * 1024 * 1024 + 123)
r = s3.put_object(Bucket="alpha", Key="big.bin", Body=big)
assert r["ETag"] == '"%s"' % hashlib.md5(big).hexdigest(), r["ETag"]
assert s3b.get_object(Bucket="alpha", Key="big.bin")["Body"].read() == big
for a, b in [(2097150, 2097160), (4194300, 8388700), (1, 9437000), (9437180, 9437306)]:
    got = s3.get_object(Bucket="alpha", Key="big.bin", Range=f"bytes={a}-{b}")["Body"].read()
    assert got == big[a:b + 1], (a, b)
s3.delete_object(Bucket="alpha", Key="big.bin")

step("concurrent large PUTs: each ETag is its own body's MD5 (bodies hashed together in lanes)")
import concurrent.futures
def put_one(n):
    data = os.urandom(1024 * 1024 + n * 4099)
    r = s3.put_object(Bucket="alpha", Key=f"lanes/{n}", Body=data)  # clients are thread-safe
    return r["ETag"], '"%s"' % hashlib.md5(data).hexdigest(), len(data)
with concurrent.futures.ThreadPoolExecutor(max_workers=10) as ex:
    for got, want, size in ex.map(put_one, range(12)):
        assert got == want, (got, want, size)
for n in range(12):
    s3.delete_object(Bucket="alpha", Key=f"lanes/{n}")

step("conditional requests")
expect_error("PreconditionFailed", s3.get_object, Bucket="alpha", Key="dir/one.bin", IfMatch='"0000"')
expect_error("304", s3.get_object, Bucket="alpha", Key="dir/one.bin", IfNoneMatch=f'"{md5}"')
s3.get_object(Bucket="alpha", Key="dir/one.bin", IfMatch=f'"{md5}"')
expect_error("PreconditionFailed", s3.put_object, Bucket="alpha", Key="dir/one.bin", Body=b"x", IfNoneMatch="*")
s3.put_object(Bucket="alpha", Key="fresh", Body=b"x", IfNoneMatch="*")

step("empty object and odd keys")
s3.put_object(Bucket="alpha", Key="empty", Body=b"")
assert s3.get_object(Bucket="alpha", Key="empty")["Body"].read() == b""
odd = "sp ace/plus+percent%/ünï/\u00e9.txt"
s3.put_object(Bucket="alpha", Key=odd, Body=b"odd")
assert s3.get_object(Bucket="alpha", Key=odd)["Body"].read() == b"odd"

step("overwrite")
s3.put_object(Bucket="alpha", Key="fresh", Body=b"second")
assert s3.get_object(Bucket="alpha", Key="fresh")["Body"].read() == b"second"

step("Content-MD5 mismatch is refused")
import base64
bad_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
expect_error("BadDigest", s3.put_object, Bucket="alpha", Key="bad", Body=b"data", ContentMD5=bad_md5)
expect_error("NoSuchKey", s3.get_object, Bucket="alpha", Key="bad")

step("listing v1/v2: prefix, delimiter, paging")
for i in range(30):
    s3.put_object(Bucket="alpha", Key=f"list/{i:03d}", Body=b"")
for d in ("a", "b", "c"):
    s3.put_object(Bucket="alpha", Key=f"tree/{d}/x", Body=b"")
    s3.put_object(Bucket="alpha", Key=f"tree/{d}/y", Body=b"")
s3.put_object(Bucket="alpha", Key="tree/top", Body=b"")
keys, token = [], None
while True:
    kw = {"Bucket": "alpha", "Prefix": "list/", "MaxKeys": 7}
    if token:
        kw["ContinuationToken"] = token
    r = s3.list_objects_v2(**kw)
    keys += [o["Key"] for o in r.get("Contents", [])]
    if not r["IsTruncated"]:
        break
    token = r["NextContinuationToken"]
assert keys == [f"list/{i:03d}" for i in range(30)], keys
r = s3.list_objects_v2(Bucket="alpha", Prefix="tree/", Delimiter="/")
assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["tree/a/", "tree/b/", "tree/c/"], r
assert [o["Key"] for o in r["Contents"]] == ["tree/top"], r
# paging through common prefixes one at a time
seen, marker = [], ""
while True:
    r = s3.list_objects(Bucket="alpha", Prefix="tree/", Delimiter="/", Marker=marker, MaxKeys=1)
    seen += [p["Prefix"] for p in r.get("CommonPrefixes", [])] + [o["Key"] for o in r.get("Contents", [])]
    if not r["IsTruncated"]:
        break
    marker = r["NextMarker"]
assert seen == ["tree/a/", "tree/b/", "tree/c/", "tree/top"], seen
all_keys = [o["Key"] for p in s3.get_paginator("list_objects").paginate(Bucket="alpha") for o in p.get("Contents", [])]
assert all_keys == sorted(all_keys) and odd in all_keys, all_keys
v = s3.list_object_versions(Bucket="alpha", Prefix="list/", MaxKeys=5)
assert [x["VersionId"] for x in v["Versions"]] == ["null"] * 5

step("copy")
c = s3.copy_object(Bucket="alpha", Key="copy.bin", CopySource={"Bucket": "alpha", "Key": "dir/one.bin"})
assert c["CopyObjectResult"]["ETag"] == f'"{md5}"'
g = s3.get_object(Bucket="alpha", Key="copy.bin")
assert g["Body"].read() == body and g["Metadata"] == {"color": "blue"}
s3.copy_object(Bucket="alpha", Key="copy.bin", CopySource={"Bucket": "alpha", "Key": "dir/one.bin"},
               MetadataDirective="REPLACE", Metadata={"k": "v"}, ContentType="text/plain")
h = s3.head_object(Bucket="alpha", Key="copy.bin")
assert h["Metadata"] == {"k": "v"} and h["ContentType"] == "text/plain"
expect_error("InvalidRequest", s3.copy_object, Bucket="alpha", Key="copy.bin",
             CopySource={"Bucket": "alpha", "Key": "copy.bin"})

step("multipart upload")
parts_data = [os.urandom(5 * 1024 * 1024), os.urandom(5 * 1024 * 1024 + 17), os.urandom(1000)]
up = s3.create_multipart_upload(Bucket="alpha", Key="mp.bin", ContentType="video/x-test")
uid = up["UploadId"]
ups = s3.list_multipart_uploads(Bucket="alpha")["Uploads"]
assert [u["UploadId"] for u in ups] == [uid], ups
etags = []
for n, d in enumerate(parts_data, 1):
    etags.append(s3.upload_part(Bucket="alpha", Key="mp.bin", UploadId=uid, PartNumber=n, Body=d)["ETag"])
    assert etags[-1] == '"%s"' % hashlib.md5(d).hexdigest(), (n, etags[-1])
# part 2 again: the second upload wins
etags[1] = s3.upload_part(Bucket="alpha", Key="mp.bin", UploadId=uid, PartNumber=2, Body=parts_data[1])["ETag"]
lp = s3.list_parts(Bucket="alpha", Key="mp.bin", UploadId=uid)
assert [p["PartNumber"] for p in lp["Parts"]] == [1, 2, 3]
assert [p["Size"] for p in lp["Parts"]] == [len(d) for d in parts_data]
expect_error("InvalidPart", s3.complete_multipart_upload, Bucket="alpha", Key="mp.bin", UploadId=uid,
             MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]})
expect_error("InvalidPartOrder", s3.complete_multipart_upload, Bucket="alpha", Key="mp.bin", UploadId=uid,
             MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": etags[1]}, {"PartNumber": 1, "ETag": etags[0]}]})
done = s3.complete_multipart_upload(Bucket="alpha", Key="mp.bin", UploadId=uid, MultipartUpload={
    "Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]})
want = hashlib.md5(b"".join(hashlib.md5(d).digest() for d in parts_data)).hexdigest() + "-3"
assert done["ETag"] == f'"{want}"', (done["ETag"], want)
whole = b"".join(parts_data)
g = s3.get_object(Bucket="alpha", Key="mp.bin")
assert g["Body"].read() == whole and g["ContentType"] == "video/x-test"
assert s3b.get_object(Bucket="alpha", Key="mp.bin", Range="bytes=5242870-5242890")["Body"].read() == whole[5242870:5242891]
p2 = s3.get_object(Bucket="alpha", Key="mp.bin", PartNumber=2)
assert p2["Body"].read() == parts_data[1] and p2["PartsCount"] == 3
expect_error("NoSuchUpload", s3.upload_part, Bucket="alpha", Key="mp.bin", UploadId=uid, PartNumber=1, Body=b"x")
small = s3.create_multipart_upload(Bucket="alpha", Key="small-mp")["UploadId"]
e1 = s3.upload_part(Bucket="alpha", Key="small-mp", UploadId=small, PartNumber=1, Body=b"a" * 100)["ETag"]
e2 = s3.upload_part(Bucket="alpha", Key="small-mp", UploadId=small, PartNumber=2, Body=b"b" * 100)["ETag"]
expect_error("EntityTooSmall", s3.complete_multipart_upload, Bucket="alpha", Key="small-mp", UploadId=small,
             MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
cp = s3.upload_part_copy(Bucket="alpha", Key="small-mp", UploadId=small, PartNumber=3,
                         CopySource={"Bucket": "alpha", "Key": "dir/one.bin"}, CopySourceRange="bytes=0-99")
assert cp["CopyPartResult"]["ETag"] == '"%s"' % hashlib.md5(body[:100]).hexdigest()
s3.abort_multipart_upload(Bucket="alpha", Key="small-mp", UploadId=small)
expect_error("NoSuchUpload", s3.list_parts, Bucket="alpha", Key="small-mp", UploadId=small)
assert s3.list_multipart_uploads(Bucket="alpha").get("Uploads", []) == []

step("multi-object delete")
r = s3.delete_objects(Bucket="alpha", Delete={"Objects": [{"Key": f"list/{i:03d}"} for i in range(30)] + [{"Key": "never-was"}]})
assert len(r["Deleted"]) == 31, r
assert s3.list_objects_v2(Bucket="alpha", Prefix="list/")["KeyCount"] == 0
s3.delete_object(Bucket="alpha", Key="never-existed")

step("presigned URL")
url = s3.generate_presigned_url("get_object", Params={"Bucket": "alpha", "Key": "fresh"}, ExpiresIn=60)
assert urllib.request.urlopen(url).read() == b"second"
expired = s3.generate_presigned_url("get_object", Params={"Bucket": "alpha", "Key": "fresh"}, ExpiresIn=1)
time.sleep(2.5)
try:
    urllib.request.urlopen(expired)
    raise AssertionError("an expired presigned URL was accepted")
except urllib.error.HTTPError as e:
    assert e.code == 403, e.code

step("wrong keys are refused")
bad = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=cfg,
                   aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"], aws_secret_access_key="wrong" * 8)
expect_error("SignatureDoesNotMatch", bad.list_buckets)
unknown = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=cfg,
                       aws_access_key_id="NOSUCHKEY", aws_secret_access_key="x" * 40)
expect_error("InvalidAccessKeyId", unknown.list_buckets)
anon = boto3.client("s3", endpoint_url=EP, region_name="us-east-1",
                    config=Config(signature_version=botocore.UNSIGNED, s3={"addressing_style": "path"}))
expect_error("AccessDenied", anon.list_objects_v2, Bucket="alpha")

step("malformed XML is refused")
mpu = s3.create_multipart_upload(Bucket="alpha", Key="xml-test")["UploadId"]
def break_body(request, **kwargs):
    request.data = b"<CompleteMultipartUpload><Part><PartNumber>1</Part"
    request.headers["Content-Length"] = str(len(request.data))
s3.meta.events.register("before-sign.s3.CompleteMultipartUpload", break_body)
expect_error("MalformedXML", s3.complete_multipart_upload, Bucket="alpha", Key="xml-test", UploadId=mpu,
             MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"x"'}]})
s3.meta.events.unregister("before-sign.s3.CompleteMultipartUpload", break_body)
s3.abort_multipart_upload(Bucket="alpha", Key="xml-test", UploadId=mpu)

step("tagging")
s3.put_object(Bucket="alpha", Key="tagged", Body=b"t", Tagging="a=1&b=x%20y")
tags = {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket="alpha", Key="tagged")["TagSet"]}
assert tags == {"a": "1", "b": "x y"}, tags
assert s3.get_object(Bucket="alpha", Key="tagged")["TagCount"] == 2
s3.put_object_tagging(Bucket="alpha", Key="tagged", Tagging={"TagSet": [{"Key": "c", "Value": "3"}]})
assert s3.get_object_tagging(Bucket="alpha", Key="tagged")["TagSet"] == [{"Key": "c", "Value": "3"}]
s3.copy_object(Bucket="alpha", Key="tagged-copy", CopySource={"Bucket": "alpha", "Key": "tagged"})
assert s3.get_object_tagging(Bucket="alpha", Key="tagged-copy")["TagSet"] == [{"Key": "c", "Value": "3"}]
s3.copy_object(Bucket="alpha", Key="tagged-copy", CopySource={"Bucket": "alpha", "Key": "tagged"},
               TaggingDirective="REPLACE", Tagging="d=4")
assert s3.get_object_tagging(Bucket="alpha", Key="tagged-copy")["TagSet"] == [{"Key": "d", "Value": "4"}]
s3.delete_object_tagging(Bucket="alpha", Key="tagged")
assert s3.get_object_tagging(Bucket="alpha", Key="tagged")["TagSet"] == []
expect_error("InvalidTag", s3.put_object_tagging, Bucket="alpha", Key="tagged",
             Tagging={"TagSet": [{"Key": f"k{i}", "Value": "v"} for i in range(11)]})
expect_error("NoSuchKey", s3.get_object_tagging, Bucket="alpha", Key="no-such")
expect_error("NoSuchTagSet", s3.get_bucket_tagging, Bucket="alpha")
s3.put_bucket_tagging(Bucket="alpha", Tagging={"TagSet": [{"Key": "team", "Value": "storage"}]})
assert s3.get_bucket_tagging(Bucket="alpha")["TagSet"] == [{"Key": "team", "Value": "storage"}]
s3.delete_bucket_tagging(Bucket="alpha")
expect_error("NoSuchTagSet", s3.get_bucket_tagging, Bucket="alpha")

step("not implemented is said, not faked")
expect_error("NotImplemented", s3.put_bucket_website, Bucket="alpha",
             WebsiteConfiguration={"IndexDocument": {"Suffix": "index.html"}})

step("bucket delete")
expect_error("BucketNotEmpty", s3.delete_bucket, Bucket="alpha")
s3.create_bucket(Bucket="empty-one")
s3.delete_bucket(Bucket="empty-one")
expect_error("404", s3.head_bucket, Bucket="empty-one")
print("boto3 suite passed", flush=True)
