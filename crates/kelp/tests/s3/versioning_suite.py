"""Versioning and lifecycle checks run with boto3 against a Kelp gateway.

Environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (from DIR/s3.env),
KELP_BIN (the kelp binary) and KELP_CONF (the cluster's kelp.conf), used to run the lifecycle
worker by hand with a one-second lifecycle day. Exits non-zero on the first failed check.
"""
import os
import subprocess
import time

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

EP = os.environ["AWS_ENDPOINT_URL"]
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
s3 = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=cfg)


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


def get(bucket, key, **kw):
    return s3.get_object(Bucket=bucket, Key=key, **kw)["Body"].read()


def all_versions(bucket, prefix="", page=1000):
    """Every (key, version id, is latest, is delete marker), paging with the markers. The
    response lists versions and delete markers apart, so within a key: the latest first, then
    the other versions newest first, then the other delete markers."""
    rows, kw = [], {}
    while True:
        r = s3.list_object_versions(Bucket=bucket, Prefix=prefix, MaxKeys=page, **kw)
        rows += [(v["Key"], v["VersionId"], v["IsLatest"], False) for v in r.get("Versions", [])]
        rows += [(m["Key"], m["VersionId"], m["IsLatest"], True) for m in r.get("DeleteMarkers", [])]
        if not r["IsTruncated"]:
            return sorted(rows, key=lambda x: (x[0], not x[2], x[3]))
        kw = {"KeyMarker": r["NextKeyMarker"]}
        if r.get("NextVersionIdMarker"):
            kw["VersionIdMarker"] = r["NextVersionIdMarker"]


def lc_run():
    out = subprocess.run([os.environ["KELP_BIN"], "s3", "lc", "run", "-c", os.environ["KELP_CONF"],
                          "--lc-day-secs", "1", "--format", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


step("versioning: states")
s3.create_bucket(Bucket="vers")
assert "Status" not in s3.get_bucket_versioning(Bucket="vers")
s3.put_object(Bucket="vers", Key="k", Body=b"v0")  # before versioning: the null version
r = s3.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Enabled"})
assert s3.get_bucket_versioning(Bucket="vers")["Status"] == "Enabled"
expect_error("MalformedXML", s3.put_bucket_versioning, Bucket="vers",
             VersioningConfiguration={"Status": "Off"})
expect_error("NotImplemented", s3.put_bucket_versioning, Bucket="vers",
             VersioningConfiguration={"Status": "Enabled", "MFADelete": "Enabled"},
             MFA="123456 654321")

step("versioning: every write is kept")
v1 = s3.put_object(Bucket="vers", Key="k", Body=b"v1")["VersionId"]
v2 = s3.put_object(Bucket="vers", Key="k", Body=b"v2")["VersionId"]
assert v1 != v2 and v1 != "null" and v2 != "null", (v1, v2)
assert get("vers", "k") == b"v2"
assert get("vers", "k", VersionId=v1) == b"v1"
assert get("vers", "k", VersionId="null") == b"v0"
h = s3.head_object(Bucket="vers", Key="k")
assert h["VersionId"] == v2, h
assert s3.get_object(Bucket="vers", Key="k", VersionId=v1)["VersionId"] == v1
assert all_versions("vers", "k") == [("k", v2, True, False), ("k", v1, False, False),
                                     ("k", "null", False, False)], all_versions("vers", "k")
expect_error("NoSuchVersion", s3.get_object, Bucket="vers", Key="k", VersionId="0" * 24)
expect_error("InvalidArgument", s3.get_object, Bucket="vers", Key="k", VersionId="bogus")

step("versioning: delete markers")
d = s3.delete_object(Bucket="vers", Key="k")
assert d["DeleteMarker"] is True and d["VersionId"] not in (v1, v2, "null"), d
dm = d["VersionId"]
expect_error("NoSuchKey", s3.get_object, Bucket="vers", Key="k")
assert get("vers", "k", VersionId=v2) == b"v2"
expect_error("405", s3.head_object, Bucket="vers", Key="k", VersionId=dm)
assert "Contents" not in s3.list_objects_v2(Bucket="vers", Prefix="k")
assert all_versions("vers", "k")[0] == ("k", dm, True, True)
# removing the delete marker brings the object back
d = s3.delete_object(Bucket="vers", Key="k", VersionId=dm)
assert d["VersionId"] == dm and d.get("DeleteMarker") is True, d
assert get("vers", "k") == b"v2"
# removing the current version makes the previous one current
s3.delete_object(Bucket="vers", Key="k", VersionId=v2)
assert get("vers", "k") == b"v1"
assert [v[1] for v in all_versions("vers", "k")] == [v1, "null"]
# deleting a version that does not exist succeeds, as on S3
s3.delete_object(Bucket="vers", Key="k", VersionId="f" * 24)

step("versioning: copy, multipart and multi-delete keep versions")
c = s3.copy_object(Bucket="vers", Key="copy", CopySource={"Bucket": "vers", "Key": "k", "VersionId": "null"})
assert c["CopySourceVersionId"] == "null" and c["VersionId"], c
assert get("vers", "copy") == b"v0"
up = s3.create_multipart_upload(Bucket="vers", Key="mp")["UploadId"]
part = s3.upload_part(Bucket="vers", Key="mp", UploadId=up, PartNumber=1, Body=b"m" * 100)
done = s3.complete_multipart_upload(Bucket="vers", Key="mp", UploadId=up, MultipartUpload={
    "Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
assert done["VersionId"], done
m2 = s3.put_object(Bucket="vers", Key="mp", Body=b"after")["VersionId"]
assert get("vers", "mp", VersionId=done["VersionId"]) == b"m" * 100
r = s3.delete_objects(Bucket="vers", Delete={"Objects": [
    {"Key": "mp", "VersionId": done["VersionId"]}, {"Key": "copy"}]})
got = {(x["Key"], x.get("VersionId")): x for x in r["Deleted"]}
assert ("mp", done["VersionId"]) in got, r
assert got[("copy", None)]["DeleteMarker"] is True and got[("copy", None)]["DeleteMarkerVersionId"], r
assert [v[1] for v in all_versions("vers", "mp")] == [m2]

step("versioning: suspended writes replace the null version")
s3.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Suspended"})
assert s3.get_bucket_versioning(Bucket="vers")["Status"] == "Suspended"
r = s3.put_object(Bucket="vers", Key="k", Body=b"s1")
assert r.get("VersionId") == "null", r
assert get("vers", "k") == b"s1" and get("vers", "k", VersionId="null") == b"s1"
assert [v[1] for v in all_versions("vers", "k")] == ["null", v1]
s3.put_object(Bucket="vers", Key="k", Body=b"s2")
assert [v[1] for v in all_versions("vers", "k")] == ["null", v1]
assert get("vers", "k", VersionId="null") == b"s2" and get("vers", "k", VersionId=v1) == b"v1"
d = s3.delete_object(Bucket="vers", Key="k")
assert d["DeleteMarker"] is True and d["VersionId"] == "null", d
assert all_versions("vers", "k") == [("k", "null", True, True), ("k", v1, False, False)]

step("versioning: listing pages through versions, markers and prefixes")
s3.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Enabled"})
for key in ["p/a", "p/b", "q/c", "r"]:
    for i in range(3):
        s3.put_object(Bucket="vers", Key=key, Body=f"{key}{i}".encode())
s3.delete_object(Bucket="vers", Key="p/b")
full = all_versions("vers")
for page in (1, 2, 3, 7):
    assert all_versions("vers", page=page) == full, page
assert len([v for v in full if v[0] == "p/b"]) == 4
assert sum(1 for v in full if v[2]) == len({v[0] for v in full})  # one latest per key
r = s3.list_object_versions(Bucket="vers", Delimiter="/")
assert sorted(p["Prefix"] for p in r["CommonPrefixes"]) == ["p/", "q/"], r
assert {v["Key"] for v in r.get("Versions", [])} <= {"k", "copy", "mp", "r"}, r
r = s3.list_object_versions(Bucket="vers", Delimiter="/", MaxKeys=1, KeyMarker="p/")
assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["q/"], r

step("versioning: a bucket with versions is not empty")
expect_error("BucketNotEmpty", s3.delete_bucket, Bucket="vers")
for key, vid, _, _ in all_versions("vers"):
    s3.delete_object(Bucket="vers", Key=key, VersionId=vid)
assert all_versions("vers") == []
s3.delete_bucket(Bucket="vers")

step("lifecycle: configuration")
s3.create_bucket(Bucket="life")
expect_error("NoSuchLifecycleConfiguration", s3.get_bucket_lifecycle_configuration, Bucket="life")
rules = [
    {"ID": "logs", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 1}},
    {"ID": "tagged", "Status": "Enabled",
     "Filter": {"And": {"Prefix": "t/", "Tags": [{"Key": "tmp", "Value": "1"}]}},
     "Expiration": {"Days": 1}},
    {"ID": "off", "Status": "Disabled", "Filter": {"Prefix": "keep/"}, "Expiration": {"Days": 1}},
    {"ID": "mpu", "Status": "Enabled", "Filter": {"Prefix": ""},
     "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}},
]
s3.put_bucket_lifecycle_configuration(Bucket="life", LifecycleConfiguration={"Rules": rules})
got = s3.get_bucket_lifecycle_configuration(Bucket="life")["Rules"]
assert [r["ID"] for r in got] == ["logs", "tagged", "off", "mpu"], got
assert got[0]["Expiration"] == {"Days": 1} and got[0]["Filter"]["Prefix"] == "logs/", got
assert got[1]["Filter"]["And"]["Tags"] == [{"Key": "tmp", "Value": "1"}], got
assert got[2]["Status"] == "Disabled"
expect_error("NotImplemented", s3.put_bucket_lifecycle_configuration, Bucket="life",
             LifecycleConfiguration={"Rules": [{"ID": "t", "Status": "Enabled", "Filter": {"Prefix": ""},
                                                "Transitions": [{"Days": 30, "StorageClass": "GLACIER"}]}]})
expect_error("InvalidArgument", s3.put_bucket_lifecycle_configuration, Bucket="life",
             LifecycleConfiguration={"Rules": [{"ID": "a", "Status": "Enabled", "Filter": {"Prefix": ""},
                                                "Expiration": {"Days": 1}},
                                               {"ID": "a", "Status": "Enabled", "Filter": {"Prefix": ""},
                                                "Expiration": {"Days": 2}}]})

step("lifecycle: expiration, tag filters, disabled rules, incomplete uploads")
for key in ["logs/1", "logs/2", "keep/1", "t/x", "t/y", "other"]:
    s3.put_object(Bucket="life", Key=key, Body=b"x",
                  Tagging="tmp=1" if key == "t/x" else "")
stale = s3.create_multipart_upload(Bucket="life", Key="big")["UploadId"]
lc_run()  # nothing is a day (a second) old yet
assert len(s3.list_objects_v2(Bucket="life")["Contents"]) == 6
assert len(s3.list_multipart_uploads(Bucket="life").get("Uploads", [])) == 1
time.sleep(1.5)
print(lc_run(), flush=True)
left = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="life")["Contents"])
assert left == ["keep/1", "other", "t/y"], left
assert s3.list_multipart_uploads(Bucket="life").get("Uploads", []) == []
expect_error("NoSuchUpload", s3.list_parts, Bucket="life", Key="big", UploadId=stale)
s3.delete_bucket_lifecycle(Bucket="life")
expect_error("NoSuchLifecycleConfiguration", s3.get_bucket_lifecycle_configuration, Bucket="life")

step("lifecycle: versioned buckets")
s3.create_bucket(Bucket="lifev")
s3.put_bucket_versioning(Bucket="lifev", VersioningConfiguration={"Status": "Enabled"})
old = s3.put_object(Bucket="lifev", Key="doc", Body=b"old")["VersionId"]
s3.put_object(Bucket="lifev", Key="doc", Body=b"new")
s3.put_object(Bucket="lifev", Key="gone", Body=b"g")
s3.delete_object(Bucket="lifev", Key="gone")
s3.put_object(Bucket="lifev", Key="exp/e", Body=b"e")
s3.put_bucket_lifecycle_configuration(Bucket="lifev", LifecycleConfiguration={"Rules": [
    {"ID": "noncurrent", "Status": "Enabled", "Filter": {"Prefix": ""},
     "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
     "Expiration": {"ExpiredObjectDeleteMarker": True}},
    {"ID": "current", "Status": "Enabled", "Filter": {"Prefix": "exp/"}, "Expiration": {"Days": 1}},
]})
time.sleep(1.5)
print(lc_run(), flush=True)
vs = all_versions("lifev")
# doc: only the current version is left; gone: its version expired, then its lone marker;
# exp/e: expired behind a delete marker (its version is now noncurrent, kept for a day)
assert [(v[0], v[3]) for v in vs] == [("doc", False), ("exp/e", True), ("exp/e", False)], vs
assert get("lifev", "doc") == b"new"
expect_error("NoSuchVersion", s3.get_object, Bucket="lifev", Key="doc", VersionId=old)
expect_error("NoSuchKey", s3.get_object, Bucket="lifev", Key="exp/e")
time.sleep(1.5)
lc_run()
# a day later the noncurrent exp/e version goes, and with it the now lone delete marker
assert [(v[0], v[3]) for v in all_versions("lifev")] == [("doc", False)], all_versions("lifev")
print("versioning suite passed", flush=True)
