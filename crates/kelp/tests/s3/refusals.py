"""Requests for what the gateway does not do are refused, never answered as if they had worked.

Walks a list of such requests against a Kelp gateway (boto3 where it can express them, raw
SigV4-signed requests through botocore's signer otherwise), checks the exact S3 error code
and HTTP status of each, and that nothing was stored (the object does not exist afterwards,
the bucket was not created, the configuration is unchanged). Then checks what is verified
rather than refused: uploads by boto3 and the aws CLI with their default checksums succeed
and read back, and a wrong checksum (header, trailer, part, document) is refused.

Environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (from DIR/s3.env);
OTHER_ACCESS_KEY_ID / OTHER_SECRET_ACCESS_KEY (another user of the cluster). Exits non-zero
on the first failed check, naming it.
"""
import base64
import hashlib
import http.client
import io
import os
import subprocess
import sys
import tempfile
import urllib.parse
import zlib

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.auth import S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

EP = os.environ["AWS_ENDPOINT_URL"]
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
s3 = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=cfg)
CREDS = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
OTHER = Credentials(os.environ["OTHER_ACCESS_KEY_ID"], os.environ["OTHER_SECRET_ACCESS_KEY"])
B = os.environ.get("REFUSALS_BUCKET", "refusals")


def step(name):
    print(f"-- {name}", flush=True)


def raw(method, path, headers=None, body=b"", query="", creds=CREDS, content_sha=None):
    """A SigV4-signed request as given (no SDK logic): (status, error code or None, body)."""
    url = EP + path + ("?" + query if query else "")
    headers = dict(headers or {})
    headers["x-amz-content-sha256"] = content_sha or hashlib.sha256(body).hexdigest()
    req = AWSRequest(method=method, url=url, data=body, headers=headers)
    SigV4Auth(creds, "s3", "us-east-1").add_auth(req)
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    target = u.path + ("?" + u.query if u.query else "")
    conn.request(method, target, body=body if body else None, headers=dict(req.headers.items()))
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    code = None
    if b"<Code>" in data:
        code = data.split(b"<Code>")[1].split(b"</Code>")[0].decode()
    return resp.status, code, data


def expect(status, code, *a, **kw):
    got = raw(*a, **kw)
    assert (got[0], got[1]) == (status, code), f"{a} {kw}: expected {status} {code}, got {got}"
    return got


def expect_error(code, status, fn, *a, **kw):
    try:
        fn(*a, **kw)
    except ClientError as e:
        got = (e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"])
        assert got == (code, status), f"{fn.__name__}: expected {code} {status}, got {got}: {e}"
        return e
    raise AssertionError(f"{fn.__name__}: expected {code}, call succeeded")


def absent(key, bucket=B):
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404, e
        return
    raise AssertionError(f"{bucket}/{key} was stored by a refused request")


def no_bucket(name):
    try:
        s3.head_bucket(Bucket=name)
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404, e
        return
    raise AssertionError(f"bucket {name} was created by a refused request")


def reflected_crc(data, poly, bits):
    """A reflected CRC (init and final xor all ones) as S3 headers carry it: base64, big-endian."""
    mask = (1 << bits) - 1
    crc = mask
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
    return base64.b64encode((crc ^ mask).to_bytes(bits // 8, "big")).decode()


def crc32_b64(data):
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


s3.create_bucket(Bucket=B)
s3.put_object(Bucket=B, Key="existing", Body=b"hello")

step("server-side encryption is refused on every write, nothing stored")
SSE_C = {
    "x-amz-server-side-encryption-customer-algorithm": "AES256",
    "x-amz-server-side-encryption-customer-key": base64.b64encode(b"k" * 32).decode(),
    "x-amz-server-side-encryption-customer-key-MD5": base64.b64encode(
        hashlib.md5(b"k" * 32).digest()).decode(),
}
for i, h in enumerate([
    {"x-amz-server-side-encryption": "AES256"},
    {"x-amz-server-side-encryption": "aws:kms"},
    {"x-amz-server-side-encryption": "aws:kms", "x-amz-server-side-encryption-aws-kms-key-id": "k"},
    {"x-amz-server-side-encryption-context": base64.b64encode(b"{}").decode()},
    {"x-amz-server-side-encryption-bucket-key-enabled": "true"},
    SSE_C,
]):
    expect(501, "NotImplemented", "PUT", f"/{B}/sse-{i}", h, b"secret")
    absent(f"sse-{i}")
    expect(501, "NotImplemented", "PUT", f"/{B}/sse-copy-{i}",
           {"x-amz-copy-source": f"/{B}/existing", **h})
    absent(f"sse-copy-{i}")
    expect(501, "NotImplemented", "POST", f"/{B}/sse-mpu-{i}", h, query="uploads")
# boto3 spells them too
expect_error("NotImplemented", 501, s3.put_object, Bucket=B, Key="sse-b", Body=b"x",
             ServerSideEncryption="AES256")
absent("sse-b")
expect_error("NotImplemented", 501, s3.put_object, Bucket=B, Key="sse-kms", Body=b"x",
             ServerSideEncryption="aws:kms", SSEKMSKeyId="alias/x", BucketKeyEnabled=True)
absent("sse-kms")
expect_error("NotImplemented", 501, s3.put_object, Bucket=B, Key="sse-c", Body=b"x",
             SSECustomerAlgorithm="AES256", SSECustomerKey="k" * 32)
absent("sse-c")
expect_error("NotImplemented", 501, s3.create_multipart_upload, Bucket=B, Key="sse-mpu",
             ServerSideEncryption="AES256")
assert not s3.list_multipart_uploads(Bucket=B).get("Uploads"), "an upload was created"
up = s3.create_multipart_upload(Bucket=B, Key="plain-mpu")["UploadId"]
expect(501, "NotImplemented", "PUT", f"/{B}/plain-mpu", SSE_C, b"x" * 10,
       query=f"partNumber=1&uploadId={up}")
assert not s3.list_parts(Bucket=B, Key="plain-mpu", UploadId=up).get("Parts"), "a part was stored"
s3.abort_multipart_upload(Bucket=B, Key="plain-mpu", UploadId=up)
# reads with customer keys: no object is SSE-C encrypted (AWS's answer for such an object)
expect_error("InvalidRequest", 400, s3.get_object, Bucket=B, Key="existing",
             SSECustomerAlgorithm="AES256", SSECustomerKey="k" * 32)
expect_error("400", 400, s3.head_object, Bucket=B, Key="existing",
             SSECustomerAlgorithm="AES256", SSECustomerKey="k" * 32)
expect(400, "InvalidRequest", "PUT", f"/{B}/copy-ssec", {
    "x-amz-copy-source": f"/{B}/existing",
    "x-amz-copy-source-server-side-encryption-customer-algorithm": "AES256"})
absent("copy-ssec")
# hoisted into a presigned URL's query (as some SDKs do), signed with it
req = AWSRequest(method="PUT", url=f"{EP}/{B}/sse-presigned?x-amz-server-side-encryption=AES256")
S3SigV4QueryAuth(CREDS, "s3", "us-east-1", expires=300).add_auth(req)
u = urllib.parse.urlsplit(req.url)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
conn.request("PUT", u.path + "?" + u.query, body=b"x")
r = conn.getresponse()
assert r.status == 501 and b"NotImplemented" in r.read(), r.status
absent("sse-presigned")

step("object lock")
for h in [{"x-amz-object-lock-mode": "GOVERNANCE",
           "x-amz-object-lock-retain-until-date": "2030-01-01T00:00:00Z"},
          {"x-amz-object-lock-legal-hold": "ON"}]:
    expect(400, "InvalidRequest", "PUT", f"/{B}/locked", h, b"x")
    absent("locked")
expect_error("InvalidRequest", 400, s3.put_object, Bucket=B, Key="locked", Body=b"x",
             ObjectLockMode="COMPLIANCE", ObjectLockRetainUntilDate="2030-01-01T00:00:00Z")
absent("locked")
expect_error("NoSuchBucket", 404, s3.put_object, Bucket="no-such-bucket-here", Key="k", Body=b"x",
             ObjectLockLegalHoldStatus="ON")
expect_error("InvalidRequest", 400, s3.delete_object, Bucket=B, Key="existing",
             BypassGovernanceRetention=True)
s3.head_object(Bucket=B, Key="existing")
expect_error("NotImplemented", 501, s3.create_bucket, Bucket="locked-bucket",
             ObjectLockEnabledForBucket=True)
no_bucket("locked-bucket")
expect_error("NotImplemented", 501, s3.create_bucket, Bucket="owned-bucket",
             ObjectOwnership="ObjectWriter")
no_bucket("owned-bucket")
expect_error("ObjectLockConfigurationNotFoundError", 404, s3.get_object_lock_configuration, Bucket=B)
expect_error("NotImplemented", 501, s3.put_object_lock_configuration, Bucket=B,
             ObjectLockConfiguration={"ObjectLockEnabled": "Enabled"})
expect_error("InvalidRequest", 400, s3.get_object_retention, Bucket=B, Key="existing")
expect_error("InvalidRequest", 400, s3.get_object_legal_hold, Bucket=B, Key="existing")
expect_error("NotImplemented", 501, s3.put_object_retention, Bucket=B, Key="existing",
             Retention={"Mode": "GOVERNANCE", "RetainUntilDate": "2030-01-01T00:00:00Z"})
expect_error("NotImplemented", 501, s3.put_object_legal_hold, Bucket=B, Key="existing",
             LegalHold={"Status": "ON"})

step("storage classes, redirects, grants, request payer, directives")
expect_error("InvalidStorageClass", 400, s3.put_object, Bucket=B, Key="glacier", Body=b"x",
             StorageClass="GLACIER")
absent("glacier")
expect(400, "InvalidStorageClass", "PUT", f"/{B}/bogus-class", {"x-amz-storage-class": "BOGUS"}, b"x")
absent("bogus-class")
s3.put_object(Bucket=B, Key="standard", Body=b"x", StorageClass="STANDARD")
expect_error("InvalidStorageClass", 400, s3.create_multipart_upload, Bucket=B, Key="ia",
             StorageClass="STANDARD_IA")
expect_error("InvalidStorageClass", 400, s3.copy_object, Bucket=B, Key="copy-ia",
             CopySource={"Bucket": B, "Key": "existing"}, StorageClass="ONEZONE_IA")
absent("copy-ia")
expect_error("NotImplemented", 501, s3.put_object, Bucket=B, Key="redirect", Body=b"x",
             WebsiteRedirectLocation="/elsewhere")
absent("redirect")
expect_error("NotImplemented", 501, s3.put_object, Bucket=B, Key="granted", Body=b"x",
             GrantRead='uri="http://acs.amazonaws.com/groups/global/AllUsers"')
absent("granted")
expect_error("NotImplemented", 501, s3.create_bucket, Bucket="granted-bucket",
             GrantFullControl='id="someone"')
no_bucket("granted-bucket")
s3.put_object(Bucket=B, Key="payer", Body=b"x", RequestPayer="requester")  # nobody pays
expect(400, "InvalidArgument", "PUT", f"/{B}/payer2", {"x-amz-request-payer": "bogus"}, b"x")
absent("payer2")
expect_error("InvalidArgument", 400, s3.copy_object, Bucket=B, Key="dir-bad",
             CopySource={"Bucket": B, "Key": "existing"}, MetadataDirective="MOVE")
absent("dir-bad")
expect(400, "InvalidArgument", "PUT", f"/{B}/dir-bad2", {
    "x-amz-copy-source": f"/{B}/existing", "x-amz-tagging-directive": "BOGUS"})
absent("dir-bad2")

step("x-amz-expected-bucket-owner is checked")
owner = s3.list_buckets()["Owner"]["ID"]
s3.put_object(Bucket=B, Key="owned", Body=b"x", ExpectedBucketOwner=owner)
expect_error("AccessDenied", 403, s3.put_object, Bucket=B, Key="not-owned", Body=b"x",
             ExpectedBucketOwner="111122223333")
absent("not-owned")
expect_error("AccessDenied", 403, s3.list_objects_v2, Bucket=B, ExpectedBucketOwner="111122223333")
expect_error("AccessDenied", 403, s3.copy_object, Bucket=B, Key="src-not-owned",
             CopySource={"Bucket": B, "Key": "existing"}, ExpectedSourceBucketOwner="111122223333")
absent("src-not-owned")

step("subresources that are not implemented")
absent_answers = [
    (s3.get_bucket_encryption, "ServerSideEncryptionConfigurationNotFoundError"),
    (s3.get_bucket_policy, "NoSuchBucketPolicy"),
    (s3.get_bucket_policy_status, "NoSuchBucketPolicy"),
    (s3.get_bucket_replication, "ReplicationConfigurationNotFoundError"),
    (s3.get_bucket_website, "NoSuchWebsiteConfiguration"),
    (s3.get_public_access_block, "NoSuchPublicAccessBlockConfiguration"),
]
for fn, code in absent_answers:
    expect_error(code, 404, fn, Bucket=B)
    expect_error("NoSuchBucket", 404, fn, Bucket="no-such-bucket-here")
other = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=cfg,
                     aws_access_key_id=OTHER.access_key, aws_secret_access_key=OTHER.secret_key)
expect_error("AccessDenied", 403, other.get_bucket_policy, Bucket=B)
for fn, kw in [
    (s3.put_bucket_encryption, {"ServerSideEncryptionConfiguration": {"Rules": [
        {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}}),
    (s3.delete_bucket_encryption, {}),
    (s3.put_bucket_policy, {"Policy": "{}"}),
    (s3.delete_bucket_policy, {}),
    (s3.put_bucket_replication, {"ReplicationConfiguration": {"Role": "r", "Rules": []}}),
    (s3.put_bucket_notification_configuration, {"NotificationConfiguration": {}}),
    (s3.get_bucket_notification_configuration, {}),
    (s3.put_bucket_logging, {"BucketLoggingStatus": {}}),
    (s3.get_bucket_logging, {}),
    (s3.put_bucket_accelerate_configuration, {"AccelerateConfiguration": {"Status": "Enabled"}}),
    (s3.get_bucket_accelerate_configuration, {}),
    (s3.put_bucket_request_payment, {"RequestPaymentConfiguration": {"Payer": "Requester"}}),
    (s3.get_bucket_request_payment, {}),
    (s3.list_bucket_inventory_configurations, {}),
    (s3.list_bucket_analytics_configurations, {}),
    (s3.list_bucket_metrics_configurations, {}),
    (s3.list_bucket_intelligent_tiering_configurations, {}),
    (s3.put_bucket_ownership_controls, {"OwnershipControls": {"Rules": [
        {"ObjectOwnership": "ObjectWriter"}]}}),
    (s3.get_bucket_ownership_controls, {}),
    (s3.put_public_access_block, {"PublicAccessBlockConfiguration": {"BlockPublicAcls": True}}),
    (s3.put_bucket_website, {"WebsiteConfiguration": {"IndexDocument": {"Suffix": "i.html"}}}),
]:
    expect_error("NotImplemented", 501, fn, Bucket=B, **kw)
expect_error("NotImplemented", 501, s3.get_object_torrent, Bucket=B, Key="existing")
expect_error("NotImplemented", 501, s3.restore_object, Bucket=B, Key="existing",
             RestoreRequest={"Days": 1})
expect_error("NotImplemented", 501, s3.get_object_attributes, Bucket=B, Key="existing",
             ObjectAttributes=["ETag"])
expect(501, "NotImplemented", "POST", f"/{B}/existing", {},
       b"<SelectObjectContentRequest/>", query="select&select-type=2")
# an unknown subresource never becomes the plain operation
expect(501, "NotImplemented", "GET", f"/{B}", query="bogus")
expect(501, "NotImplemented", "PUT", f"/{B}/sub-bogus", {}, b"x", query="bogus")
absent("sub-bogus")
expect(501, "NotImplemented", "DELETE", f"/{B}/existing", query="bogus")
s3.head_object(Bucket=B, Key="existing")
expect(501, "NotImplemented", "DELETE", f"/{B}", query="bogus")
s3.head_bucket(Bucket=B)
# a parameter with a value is ignored, as AWS does (cache busting)
assert raw("GET", f"/{B}/existing", query="v=3")[0] == 200

step("conditional writes")
expect_error("PreconditionFailed", 412, s3.put_object, Bucket=B, Key="existing", Body=b"new",
             IfNoneMatch="*")
expect(501, "NotImplemented", "PUT", f"/{B}/cond", {"If-None-Match": '"abc"'}, b"x")
absent("cond")
etag = s3.head_object(Bucket=B, Key="existing")["ETag"]
part = os.urandom(5 << 20)


def upload(key):
    uid = s3.create_multipart_upload(Bucket=B, Key=key)["UploadId"]
    e = s3.upload_part(Bucket=B, Key=key, UploadId=uid, PartNumber=1, Body=part)
    return uid, [{"PartNumber": 1, "ETag": e["ETag"], "ChecksumCRC32": e["ChecksumCRC32"]}]


uid, parts = upload("existing")
expect_error("PreconditionFailed", 412, s3.complete_multipart_upload, Bucket=B, Key="existing",
             UploadId=uid, MultipartUpload={"Parts": parts}, IfNoneMatch="*")
expect_error("PreconditionFailed", 412, s3.complete_multipart_upload, Bucket=B, Key="existing",
             UploadId=uid, MultipartUpload={"Parts": parts}, IfMatch='"0123"')
assert s3.get_object(Bucket=B, Key="existing")["Body"].read() == b"hello"
s3.complete_multipart_upload(Bucket=B, Key="existing", UploadId=uid,
                             MultipartUpload={"Parts": parts}, IfMatch=etag)
assert s3.get_object(Bucket=B, Key="existing")["Body"].read() == part
uid, parts = upload("fresh-mpu")
s3.complete_multipart_upload(Bucket=B, Key="fresh-mpu", UploadId=uid,
                             MultipartUpload={"Parts": parts}, IfNoneMatch="*")
uid, parts = upload("sized-mpu")
expect_error("InvalidRequest", 400, s3.complete_multipart_upload, Bucket=B, Key="sized-mpu",
             UploadId=uid, MultipartUpload={"Parts": parts}, MpuObjectSize=1)
absent("sized-mpu")
s3.abort_multipart_upload(Bucket=B, Key="sized-mpu", UploadId=uid)
# CopyObject's destination conditions
expect(412, "PreconditionFailed", "PUT", f"/{B}/existing",
       {"x-amz-copy-source": f"/{B}/standard", "If-None-Match": "*"})
assert s3.get_object(Bucket=B, Key="existing")["Body"].read() == part
status, _, _ = raw("PUT", f"/{B}/copied-once",
                   {"x-amz-copy-source": f"/{B}/standard", "If-None-Match": "*"})
assert status == 200, status

step("checksums: what clients send by default is verified")
body = os.urandom(300_000)
r = s3.put_object(Bucket=B, Key="default-put", Body=body)  # boto3 adds a CRC32
assert r.get("ChecksumCRC32") == crc32_b64(body), r
s3.upload_fileobj(io.BytesIO(body * 40), B, "default-mpu",
                  Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
assert s3.get_object(Bucket=B, Key="default-mpu", ChecksumMode="ENABLED")["Body"].read() == body * 40
s3.put_object(Bucket=B, Key="sha", Body=body, ChecksumAlgorithm="SHA256")
# CRC32C and CRC64NVME need botocore[crt] in boto3: computed here, sent raw
small_body = body[:2000]
for alg, value in [("crc32c", reflected_crc(small_body, 0x82F63B78, 32)),
                   ("crc64nvme", reflected_crc(small_body, 0x9A6C9329AC4BC9B5, 64))]:
    expect(200, None, "PUT", f"/{B}/{alg}", {f"x-amz-checksum-{alg}": value}, small_body)
    wrong = base64.b64encode(bytes(len(base64.b64decode(value)))).decode()
    expect(400, "BadDigest", "PUT", f"/{B}/{alg}-bad", {f"x-amz-checksum-{alg}": wrong}, small_body)
    absent(f"{alg}-bad")
s3.put_object(Bucket=B, Key="sha1", Body=body, ChecksumAlgorithm="SHA1")
r = s3.copy_object(Bucket=B, Key="copied-sum", CopySource={"Bucket": B, "Key": "default-put"},
                   ChecksumAlgorithm="CRC32")
assert r["CopyObjectResult"].get("ChecksumCRC32") == crc32_b64(body), r
with tempfile.TemporaryDirectory() as d:
    small, big = os.path.join(d, "small"), os.path.join(d, "big")
    open(small, "wb").write(body)
    open(big, "wb").write(body * 40)
    for src, key in [(small, "cli-small"), (big, "cli-big")]:
        subprocess.run([sys.executable, "-m", "awscli", "s3", "cp", "--only-show-errors", src,
                        f"s3://{B}/{key}"], check=True)
        subprocess.run([sys.executable, "-m", "awscli", "s3", "cp", "--only-show-errors",
                        f"s3://{B}/{key}", os.path.join(d, "back")], check=True)
        assert open(os.path.join(d, "back"), "rb").read() == open(src, "rb").read(), key

step("checksums: a wrong one is refused and nothing stored")
expect_error("BadDigest", 400, s3.put_object, Bucket=B, Key="bad-sum", Body=b"data",
             ChecksumCRC32="AAAAAA==")
absent("bad-sum")
expect_error("BadDigest", 400, s3.put_object, Bucket=B, Key="bad-sum", Body=b"data",
             ChecksumSHA256=base64.b64encode(b"\0" * 32).decode())
absent("bad-sum")
expect(400, "BadDigest", "PUT", f"/{B}/bad-sum", {"x-amz-checksum-crc64nvme": "AAAAAAAAAAA="}, b"x")
absent("bad-sum")
expect(400, "InvalidRequest", "PUT", f"/{B}/alg-only", {"x-amz-sdk-checksum-algorithm": "CRC32"}, b"x")
absent("alg-only")
expect(400, "InvalidRequest", "PUT", f"/{B}/two-sums",
       {"x-amz-checksum-crc32": crc32_b64(b"x"), "x-amz-checksum-sha1": "AAAA"}, b"x")
absent("two-sums")
expect(501, "NotImplemented", "PUT", f"/{B}/xx", {"x-amz-checksum-xxhash64": "AAAA"}, b"x")
absent("xx")


def chunked(data, trailer):
    out = b"%x\r\n" % len(data) + data + b"\r\n" if data else b""
    out += b"0\r\n"
    if trailer:
        out += trailer.encode() + b"\r\n"
    return out + b"\r\n"


def trailing(key, data, trailer_line, declared="x-amz-checksum-crc32"):
    body = chunked(data, trailer_line)
    return raw("PUT", f"/{B}/{key}", {
        "Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data)),
        "x-amz-trailer": declared, "x-amz-sdk-checksum-algorithm": "CRC32",
    }, body, content_sha="STREAMING-UNSIGNED-PAYLOAD-TRAILER")


status, code, _ = trailing("trailed", b"hello", f"x-amz-checksum-crc32:{crc32_b64(b'hello')}")
assert status == 200, (status, code)
assert s3.get_object(Bucket=B, Key="trailed")["Body"].read() == b"hello"
status, code, _ = trailing("bad-trailer", b"hello", "x-amz-checksum-crc32:AAAAAA==")
assert (status, code) == (400, "BadDigest"), (status, code)
absent("bad-trailer")
status, code, _ = trailing("no-trailer", b"hello", None)
assert status == 400, (status, code)
absent("no-trailer")
# a part whose checksum the completion does not match
uid = s3.create_multipart_upload(Bucket=B, Key="bad-part", ChecksumAlgorithm="CRC32")["UploadId"]
e = s3.upload_part(Bucket=B, Key="bad-part", UploadId=uid, PartNumber=1, Body=b"x" * 100,
                   ChecksumAlgorithm="CRC32")
expect_error("InvalidPart", 400, s3.complete_multipart_upload, Bucket=B, Key="bad-part",
             UploadId=uid, MultipartUpload={"Parts": [
                 {"PartNumber": 1, "ETag": e["ETag"], "ChecksumCRC32": "AAAAAA=="}]})
absent("bad-part")
expect_error("BadDigest", 400, s3.upload_part, Bucket=B, Key="bad-part", UploadId=uid,
             PartNumber=2, Body=b"y" * 100, ChecksumCRC32="AAAAAA==")
s3.complete_multipart_upload(Bucket=B, Key="bad-part", UploadId=uid, MultipartUpload={"Parts": [
    {"PartNumber": 1, "ETag": e["ETag"], "ChecksumCRC32": e["ChecksumCRC32"]}]})
# documents (boto3 sends a CRC32 with every one): verified before they are parsed
tagging = b'<Tagging><TagSet><Tag><Key>a</Key><Value>b</Value></Tag></TagSet></Tagging>'
expect(400, "BadDigest", "PUT", f"/{B}", {"x-amz-checksum-crc32": "AAAAAA=="}, tagging, query="tagging")
expect(400, "BadDigest", "PUT", f"/{B}", {"Content-MD5": base64.b64encode(b"\0" * 16).decode()},
       tagging, query="tagging")
expect_error("NoSuchTagSet", 404, s3.get_bucket_tagging, Bucket=B)
expect(200, None, "PUT", f"/{B}", {"x-amz-checksum-crc32": crc32_b64(tagging)}, tagging, query="tagging")
s3.put_bucket_tagging(Bucket=B, Tagging={"TagSet": [{"Key": "c", "Value": "d"}]})
assert s3.get_bucket_tagging(Bucket=B)["TagSet"] == [{"Key": "c", "Value": "d"}]
s3.delete_objects(Bucket=B, Delete={"Objects": [{"Key": "copied-once"}]})
absent("copied-once")

step("lifecycle: invalid rules and actions that are not performed")


def lifecycle(*rules):
    return dict(Bucket=B, LifecycleConfiguration={"Rules": list(rules)})


def rule(**kw):
    return {"ID": "r", "Status": "Enabled", "Filter": {"Prefix": ""}, **kw}


expect_error("InvalidArgument", 400, s3.put_bucket_lifecycle_configuration,
             **lifecycle(rule(Expiration={"Days": 0})))
expect_error("InvalidArgument", 400, s3.put_bucket_lifecycle_configuration,
             **lifecycle(rule(Expiration={"Days": 1, "Date": "2030-01-01T00:00:00Z"})))
expect_error("InvalidArgument", 400, s3.put_bucket_lifecycle_configuration,
             **lifecycle(rule(Expiration={"Date": "2030-01-01T10:00:00Z"})))
expect_error("MalformedXML", 400, s3.put_bucket_lifecycle_configuration,
             **lifecycle(rule(Expiration={"Days": 1, "ExpiredObjectDeleteMarker": True})))
expect_error("MalformedXML", 400, s3.put_bucket_lifecycle_configuration,
             **lifecycle(rule(Status="Sometimes", Expiration={"Days": 1})))
def lifecycle_xml(rule_xml):
    doc = f"<LifecycleConfiguration><Rule>{rule_xml}</Rule></LifecycleConfiguration>".encode()
    return raw("PUT", f"/{B}", {"Content-MD5": base64.b64encode(hashlib.md5(doc).digest()).decode()},
               doc, query="lifecycle")


# a Filter holds one condition (several go under And); a Filter and a rule-level Prefix
got = lifecycle_xml("<ID>r</ID><Status>Enabled</Status><Filter><Prefix>a</Prefix><Tag><Key>k</Key>"
                    "<Value>v</Value></Tag></Filter><Expiration><Days>1</Days></Expiration>")
assert got[:2] == (400, "MalformedXML"), got
got = lifecycle_xml("<ID>r</ID><Status>Enabled</Status><Prefix>a</Prefix><Filter><Prefix>b</Prefix>"
                    "</Filter><Expiration><Days>1</Days></Expiration>")
assert got[:2] == (400, "MalformedXML"), got
expect_error("InvalidArgument", 400, s3.put_bucket_lifecycle_configuration, **lifecycle(rule()))
expect_error("InvalidRequest", 400, s3.put_bucket_lifecycle_configuration,
             **lifecycle(rule(Filter={"Tag": {"Key": "k", "Value": "v"}},
                              AbortIncompleteMultipartUpload={"DaysAfterInitiation": 1})))
expect_error("NotImplemented", 501, s3.put_bucket_lifecycle_configuration,
             **lifecycle(rule(Transitions=[{"Days": 30, "StorageClass": "GLACIER"}])))
expect_error("NotImplemented", 501, s3.put_bucket_lifecycle_configuration,
             **lifecycle(rule(NoncurrentVersionTransitions=[
                 {"NoncurrentDays": 30, "StorageClass": "GLACIER"}])))
unknown = (b'<LifecycleConfiguration><Rule><ID>r</ID><Status>Enabled</Status><Filter><Prefix>'
           b'</Prefix></Filter><Expiration><Days>1</Days></Expiration><Archive><Days>2</Days>'
           b'</Archive></Rule></LifecycleConfiguration>')
expect(400, "MalformedXML", "PUT", f"/{B}", {"Content-MD5": base64.b64encode(
    hashlib.md5(unknown).digest()).decode()}, unknown, query="lifecycle")
expect_error("NoSuchLifecycleConfiguration", 404, s3.get_bucket_lifecycle_configuration, Bucket=B)
s3.put_bucket_lifecycle_configuration(**lifecycle(rule(
    Filter={"And": {"Prefix": "a/", "ObjectSizeGreaterThan": 10}}, Expiration={"Days": 3})))
got = s3.get_bucket_lifecycle_configuration(Bucket=B)["Rules"]
assert got[0]["Filter"]["And"]["ObjectSizeGreaterThan"] == 10, got
# what GET answers is accepted back as it is
s3.put_bucket_lifecycle_configuration(Bucket=B, LifecycleConfiguration={"Rules": got})

print("refusals: all checks passed")
