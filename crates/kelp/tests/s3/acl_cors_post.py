"""Canned ACLs, CORS and browser POST uploads, checked with boto3 and plain HTTP against a Kelp
gateway.

Environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (the owner of the
buckets made here) and OTHER_ACCESS_KEY_ID, OTHER_SECRET_ACCESS_KEY (another user of the same
cluster). Exits non-zero on the first failed check, naming it.
"""
import hashlib
import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import xml.etree.ElementTree as ET

import boto3
import botocore
from botocore.config import Config
from botocore.exceptions import ClientError

EP = os.environ["AWS_ENDPOINT_URL"]
ALL = "http://acs.amazonaws.com/groups/global/AllUsers"
AUTHN = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers"
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
s3 = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=cfg)
bob = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=cfg,
                   aws_access_key_id=os.environ["OTHER_ACCESS_KEY_ID"],
                   aws_secret_access_key=os.environ["OTHER_SECRET_ACCESS_KEY"])
# browser forms signed with SigV4 (boto3 signs them with SigV2 unless told)
v4 = Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1})
s3_v4 = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=v4)
bob_v4 = boto3.client("s3", endpoint_url=EP, region_name="us-east-1", config=v4,
                      aws_access_key_id=os.environ["OTHER_ACCESS_KEY_ID"],
                      aws_secret_access_key=os.environ["OTHER_SECRET_ACCESS_KEY"])
anon = boto3.client("s3", endpoint_url=EP, region_name="us-east-1",
                    config=Config(signature_version=botocore.UNSIGNED, s3={"addressing_style": "path"},
                                  retries={"max_attempts": 1}))


def step(name):
    print(f"-- {name}", flush=True)


def expect_error(code, fn, *a, **kw):
    try:
        fn(*a, **kw)
    except ClientError as e:
        got = e.response["Error"]["Code"]
        assert got == code, f"expected {code}, got {got}: {e}"
        return e
    raise AssertionError(f"expected {code}, call succeeded")


def http_request(method, path, headers=None, body=None):
    """A plain, unsigned HTTP request (redirects not followed): (status, headers, body)."""
    u = urllib.parse.urlsplit(EP)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    hs = {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    return r.status, hs, data


def error_code(body):
    return ET.fromstring(body).findtext("Code")


def post_form(url, fields, filename, data, content_type="application/octet-stream"):
    """A browser-style multipart/form-data POST (the file last, as S3 wants it)."""
    b = "----kelp" + uuid.uuid4().hex
    out = b""
    for k, v in fields.items():
        out += f'--{b}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
    out += (f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n").encode() + data + b"\r\n"
    out += f"--{b}--\r\n".encode()
    path = urllib.parse.urlsplit(url).path
    return http_request("POST", path, {"Content-Type": f"multipart/form-data; boundary={b}"}, out)


def grants(acl):
    return {(g["Grantee"].get("URI") or g["Grantee"].get("ID"), g["Permission"]) for g in acl["Grants"]}


step("canned ACLs on objects")
s3.create_bucket(Bucket="acl-private")
s3.put_object(Bucket="acl-private", Key="private.txt", Body=b"secret")
s3.put_object(Bucket="acl-private", Key="public.txt", Body=b"hello world", ACL="public-read")
s3.put_object(Bucket="acl-private", Key="members.txt", Body=b"members", ACL="authenticated-read")
# anonymous: a plain unsigned URL and botocore's UNSIGNED mode
assert urllib.request.urlopen(f"{EP}/acl-private/public.txt").read() == b"hello world"
assert anon.get_object(Bucket="acl-private", Key="public.txt")["Body"].read() == b"hello world"
assert anon.head_object(Bucket="acl-private", Key="public.txt")["ContentLength"] == 11
status, _, body = http_request("GET", "/acl-private/private.txt")
assert status == 403 and error_code(body) == "AccessDenied", (status, body)
expect_error("AccessDenied", anon.get_object, Bucket="acl-private", Key="private.txt")
expect_error("AccessDenied", anon.get_object, Bucket="acl-private", Key="members.txt")
# a missing key is not revealed to who may not list the bucket
expect_error("AccessDenied", anon.get_object, Bucket="acl-private", Key="no-such-key")
expect_error("AccessDenied", anon.list_objects_v2, Bucket="acl-private")
expect_error("AccessDenied", anon.put_object, Bucket="acl-private", Key="x", Body=b"x")
expect_error("AccessDenied", anon.get_bucket_acl, Bucket="acl-private")
# another user of the cluster
assert bob.get_object(Bucket="acl-private", Key="members.txt")["Body"].read() == b"members"
assert bob.get_object(Bucket="acl-private", Key="public.txt")["Body"].read() == b"hello world"
expect_error("AccessDenied", bob.get_object, Bucket="acl-private", Key="private.txt")
expect_error("AccessDenied", bob.list_objects_v2, Bucket="acl-private")
expect_error("AccessDenied", bob.put_object, Bucket="acl-private", Key="x", Body=b"x")
expect_error("AccessDenied", bob.delete_object, Bucket="acl-private", Key="public.txt")
expect_error("AccessDenied", bob.get_object_acl, Bucket="acl-private", Key="public.txt")
expect_error("AccessDenied", bob.put_object_acl, Bucket="acl-private", Key="private.txt", ACL="public-read")
expect_error("AccessDenied", bob.copy_object, Bucket="acl-private", Key="stolen",
             CopySource={"Bucket": "acl-private", "Key": "private.txt"})

step("GetObjectAcl / PutObjectAcl")
acl = s3.get_object_acl(Bucket="acl-private", Key="public.txt")
owner = acl["Owner"]["ID"]
assert grants(acl) == {(owner, "FULL_CONTROL"), (ALL, "READ")}, acl
assert [g["Grantee"]["Type"] for g in acl["Grants"]] == ["CanonicalUser", "Group"], acl
assert grants(s3.get_object_acl(Bucket="acl-private", Key="private.txt")) == {(owner, "FULL_CONTROL")}
assert grants(s3.get_object_acl(Bucket="acl-private", Key="members.txt")) == {(owner, "FULL_CONTROL"), (AUTHN, "READ")}
s3.put_object_acl(Bucket="acl-private", Key="private.txt", ACL="public-read")
assert anon.get_object(Bucket="acl-private", Key="private.txt")["Body"].read() == b"secret"
s3.put_object_acl(Bucket="acl-private", Key="private.txt", ACL="private")
expect_error("AccessDenied", anon.get_object, Bucket="acl-private", Key="private.txt")
# a policy body that is exactly a canned ACL is accepted; anything else is not implemented
s3.put_object_acl(Bucket="acl-private", Key="private.txt", AccessControlPolicy={
    "Owner": {"ID": owner},
    "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": owner}, "Permission": "FULL_CONTROL"},
               {"Grantee": {"Type": "Group", "URI": ALL}, "Permission": "READ"}]})
assert anon.get_object(Bucket="acl-private", Key="private.txt")["Body"].read() == b"secret"
expect_error("NotImplemented", s3.put_object_acl, Bucket="acl-private", Key="private.txt", AccessControlPolicy={
    "Owner": {"ID": owner},
    "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": owner}, "Permission": "FULL_CONTROL"},
               {"Grantee": {"Type": "CanonicalUser", "ID": "someone-else"}, "Permission": "READ"}]})
expect_error("NotImplemented", s3.put_object_acl, Bucket="acl-private", Key="private.txt",
             GrantRead=f'uri="{ALL}"')
expect_error("NotImplemented", s3.put_object, Bucket="acl-private", Key="g", Body=b"g", GrantRead=f'uri="{ALL}"')
expect_error("InvalidArgument", s3.put_object, Bucket="acl-private", Key="bad-acl", Body=b"x", ACL="everyone")
s3.put_object_acl(Bucket="acl-private", Key="private.txt", ACL="bucket-owner-full-control")
expect_error("AccessDenied", anon.get_object, Bucket="acl-private", Key="private.txt")
# copies get the ACL of the request, not the source's; multipart uploads keep theirs
s3.copy_object(Bucket="acl-private", Key="copy.txt", CopySource={"Bucket": "acl-private", "Key": "public.txt"})
expect_error("AccessDenied", anon.get_object, Bucket="acl-private", Key="copy.txt")
s3.copy_object(Bucket="acl-private", Key="copy.txt", CopySource={"Bucket": "acl-private", "Key": "public.txt"},
               ACL="public-read")
assert anon.get_object(Bucket="acl-private", Key="copy.txt")["Body"].read() == b"hello world"
up = s3.create_multipart_upload(Bucket="acl-private", Key="mp.txt", ACL="public-read")["UploadId"]
e = s3.upload_part(Bucket="acl-private", Key="mp.txt", UploadId=up, PartNumber=1, Body=b"multi")["ETag"]
s3.complete_multipart_upload(Bucket="acl-private", Key="mp.txt", UploadId=up,
                             MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e}]})
assert anon.get_object(Bucket="acl-private", Key="mp.txt")["Body"].read() == b"multi"

step("canned ACLs on buckets")
s3.create_bucket(Bucket="acl-public", ACL="public-read")
assert grants(s3.get_bucket_acl(Bucket="acl-public")) == {(owner, "FULL_CONTROL"), (ALL, "READ")}
s3.put_object(Bucket="acl-public", Key="inside.txt", Body=b"inside")
s3.put_object(Bucket="acl-public", Key="page.html", Body=b"<p>hi</p>", ACL="public-read", ContentType="text/html")
anon.head_bucket(Bucket="acl-public")
keys = [o["Key"] for o in anon.list_objects_v2(Bucket="acl-public")["Contents"]]
assert keys == ["inside.txt", "page.html"], keys
assert [o["Key"] for o in bob.list_objects(Bucket="acl-public")["Contents"]] == keys
# the bucket's READ lists; reading an object takes the object's own grant (as S3)
expect_error("AccessDenied", anon.get_object, Bucket="acl-public", Key="inside.txt")
expect_error("NoSuchKey", anon.get_object, Bucket="acl-public", Key="no-such-key")
expect_error("AccessDenied", anon.put_object, Bucket="acl-public", Key="x", Body=b"x")
expect_error("AccessDenied", bob.put_bucket_acl, Bucket="acl-public", ACL="public-read-write")
expect_error("AccessDenied", bob.delete_bucket, Bucket="acl-public")
s3.create_bucket(Bucket="acl-open", ACL="public-read-write")
assert grants(s3.get_bucket_acl(Bucket="acl-open")) == {(owner, "FULL_CONTROL"), (ALL, "READ"), (ALL, "WRITE")}
anon.put_object(Bucket="acl-open", Key="from-anon", Body=b"anonymous")
bob.put_object(Bucket="acl-open", Key="from-bob", Body=b"bob", ACL="public-read")
assert s3.get_object(Bucket="acl-open", Key="from-anon")["Body"].read() == b"anonymous"
assert anon.get_object(Bucket="acl-open", Key="from-bob")["Body"].read() == b"bob"
anon.delete_object(Bucket="acl-open", Key="from-anon")
expect_error("NoSuchKey", s3.get_object, Bucket="acl-open", Key="from-anon")
s3.put_bucket_acl(Bucket="acl-open", ACL="private")
expect_error("AccessDenied", anon.put_object, Bucket="acl-open", Key="x", Body=b"x")
assert grants(s3.get_bucket_acl(Bucket="acl-open")) == {(owner, "FULL_CONTROL")}
s3.create_bucket(Bucket="acl-members", ACL="authenticated-read")
bob.list_objects_v2(Bucket="acl-members")
expect_error("AccessDenied", anon.list_objects_v2, Bucket="acl-members")
expect_error("InvalidArgument", s3.create_bucket, Bucket="acl-bad", ACL="bucket-owner-read")
expect_error("404", s3.head_bucket, Bucket="acl-bad")

step("CORS configuration")
expect_error("NoSuchCORSConfiguration", s3.get_bucket_cors, Bucket="acl-public")
rules = [
    {"ID": "app", "AllowedOrigins": ["https://*.example.com"], "AllowedMethods": ["GET", "PUT"],
     "AllowedHeaders": ["content-type", "x-amz-*"], "ExposeHeaders": ["ETag"], "MaxAgeSeconds": 600},
    {"AllowedOrigins": ["*"], "AllowedMethods": ["GET", "HEAD"]},
]
s3.put_bucket_cors(Bucket="acl-public", CORSConfiguration={"CORSRules": rules})
got = s3.get_bucket_cors(Bucket="acl-public")["CORSRules"]
assert got == rules, got
expect_error("InvalidRequest", s3.put_bucket_cors, Bucket="acl-public", CORSConfiguration={
    "CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}]})
expect_error("InvalidRequest", s3.put_bucket_cors, Bucket="acl-public", CORSConfiguration={
    "CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}] * 101})
expect_error("AccessDenied", bob.get_bucket_cors, Bucket="acl-public")
assert s3.get_bucket_cors(Bucket="acl-public")["CORSRules"] == rules

step("CORS preflight and headers")
status, hs, _ = http_request("OPTIONS", "/acl-public/page.html", {
    "Origin": "https://app.example.com", "Access-Control-Request-Method": "PUT",
    "Access-Control-Request-Headers": "Content-Type, X-Amz-Date"})
assert status == 200, status
assert hs["access-control-allow-origin"] == "https://app.example.com", hs
assert hs["access-control-allow-methods"] == "GET, PUT", hs
assert hs["access-control-allow-headers"] == "content-type, x-amz-date", hs
assert hs["access-control-max-age"] == "600" and hs["access-control-expose-headers"] == "ETag", hs
assert hs["access-control-allow-credentials"] == "true", hs
for origin, method, extra in [("https://evil.test", "PUT", {}),                       # origin not allowed to PUT
                              ("https://app.example.com", "DELETE", {}),              # method not allowed
                              ("https://app.example.com", "PUT", {"Access-Control-Request-Headers": "Authorization"})]:
    status, hs, body = http_request("OPTIONS", "/acl-public/page.html", {
        "Origin": origin, "Access-Control-Request-Method": method, **extra})
    assert status == 403 and error_code(body) == "AccessForbidden", (origin, method, status, body)
    assert "access-control-allow-origin" not in hs, hs
status, hs, _ = http_request("OPTIONS", "/acl-public/page.html", {
    "Origin": "https://evil.test", "Access-Control-Request-Method": "GET"})
assert status == 200 and hs["access-control-allow-origin"] == "*", (status, hs)
status, _, _ = http_request("OPTIONS", "/acl-private/public.txt", {
    "Origin": "https://app.example.com", "Access-Control-Request-Method": "GET"})
assert status == 403, status  # no CORS configuration
status, hs, body = http_request("GET", "/acl-public/page.html", {"Origin": "https://app.example.com"})
assert status == 200 and body == b"<p>hi</p>", status
assert hs["access-control-allow-origin"] == "https://app.example.com" and hs["access-control-expose-headers"] == "ETag", hs
status, hs, _ = http_request("GET", "/acl-public/page.html", {"Origin": "https://other.test"})
assert status == 200 and hs["access-control-allow-origin"] == "*", hs
status, hs, _ = http_request("GET", "/acl-public/page.html")
assert "access-control-allow-origin" not in hs, hs
status, hs, _ = http_request("GET", "/acl-private/public.txt", {"Origin": "https://app.example.com"})
assert status == 200 and "access-control-allow-origin" not in hs, hs
s3.delete_bucket_cors(Bucket="acl-public")
expect_error("NoSuchCORSConfiguration", s3.get_bucket_cors, Bucket="acl-public")
status, _, _ = http_request("OPTIONS", "/acl-public/page.html", {
    "Origin": "https://app.example.com", "Access-Control-Request-Method": "GET"})
assert status == 403, status

step("browser POST uploads")
data = os.urandom(300_000)
post = s3_v4.generate_presigned_post(
    Bucket="acl-private", Key="uploads/${filename}",
    Fields={"acl": "public-read", "Content-Type": "image/png", "x-amz-meta-owner": "alice",
            "success_action_status": "201"},
    Conditions=[{"acl": "public-read"}, {"Content-Type": "image/png"}, {"x-amz-meta-owner": "alice"},
                {"success_action_status": "201"}, ["content-length-range", 1, 1_000_000]],
    ExpiresIn=300)
status, hs, body = post_form(post["url"], post["fields"], "photo.png", data, "image/png")
assert status == 201, (status, body)
doc = ET.fromstring(body)
ns = {"s3": doc.tag.split("}")[0].strip("{")} if doc.tag.startswith("{") else {}
key_el = doc.find("s3:Key", ns) if ns else doc.find("Key")
assert key_el is not None and key_el.text == "uploads/photo.png", body
etag_el = doc.find("s3:ETag", ns) if ns else doc.find("ETag")
assert etag_el.text == '"%s"' % hashlib.md5(data).hexdigest() == hs["etag"], (body, hs)
g = s3.get_object(Bucket="acl-private", Key="uploads/photo.png")
assert g["Body"].read() == data, "the POSTed object does not read back byte for byte"
assert g["ContentType"] == "image/png" and g["Metadata"] == {"owner": "alice"}, g
assert g["ETag"] == '"%s"' % hashlib.md5(data).hexdigest()
assert anon.get_object(Bucket="acl-private", Key="uploads/photo.png")["Body"].read() == data  # acl field applied
# default answer 204; a redirect is 303 to the given URL with bucket, key and ETag
plain = s3_v4.generate_presigned_post(Bucket="acl-private", Key="posted/plain.bin", ExpiresIn=300)
assert plain["fields"]["x-amz-algorithm"] == "AWS4-HMAC-SHA256", plain
status, _, _ = post_form(plain["url"], plain["fields"], "plain.bin", b"plain bytes")
assert status == 204, status
# boto3's default, SigV2-signed forms work too
v2 = s3.generate_presigned_post(Bucket="acl-private", Key="posted/v2.bin")
assert "signature" in v2["fields"], v2
status, _, body = post_form(v2["url"], v2["fields"], "v2.bin", b"v2 form")
assert status == 204, (status, body)
assert s3.get_object(Bucket="acl-private", Key="posted/v2.bin")["Body"].read() == b"v2 form"
assert s3.get_object(Bucket="acl-private", Key="posted/plain.bin")["Body"].read() == b"plain bytes"
expect_error("AccessDenied", anon.get_object, Bucket="acl-private", Key="posted/plain.bin")
redir = s3_v4.generate_presigned_post(Bucket="acl-private", Key="posted/${filename}",
                                   Fields={"success_action_redirect": "http://app.example.com/done"},
                                   Conditions=[{"success_action_redirect": "http://app.example.com/done"}])
status, hs, _ = post_form(redir["url"], redir["fields"], "r.txt", b"r")
assert status == 303, status
loc = urllib.parse.urlsplit(hs["location"])
q = urllib.parse.parse_qs(loc.query)
assert loc.netloc == "app.example.com" and q["key"] == ["posted/r.txt"] and q["bucket"] == ["acl-private"], hs
# policy violations, refused with AWS's codes
small = s3_v4.generate_presigned_post(Bucket="acl-private", Key="posted/small.bin",
                                   Conditions=[["content-length-range", 1, 1000]])
status, _, body = post_form(small["url"], small["fields"], "big.bin", b"x" * 5000)
assert status == 400 and error_code(body) == "EntityTooLarge", (status, body)
wrong_key = dict(small["fields"], key="elsewhere/small.bin")
status, _, body = post_form(small["url"], wrong_key, "s.bin", b"x")
assert status == 403 and error_code(body) == "AccessDenied", (status, body)
assert ET.fromstring(body).findtext("Message").startswith("Invalid according to Policy: Policy condition 'eq'"), body
prefix = s3_v4.generate_presigned_post(Bucket="acl-private", Key="uploads/${filename}")
status, _, body = post_form(prefix["url"], dict(prefix["fields"], key="other/${filename}"), "s.bin", b"x")
assert status == 403 and error_code(body) == "AccessDenied", (status, body)
extra = dict(small["fields"], **{"x-amz-meta-sneaky": "1"})
status, _, body = post_form(small["url"], extra, "s.bin", b"x")
assert status == 403 and error_code(body) == "AccessDenied", (status, body)
bad_sig = dict(small["fields"], **{"x-amz-signature": "0" * 64})
status, _, body = post_form(small["url"], bad_sig, "s.bin", b"x")
assert status == 403 and error_code(body) == "SignatureDoesNotMatch", (status, body)
# another user's signed form cannot write into a private bucket; anyone may into a public-write one
theirs = bob_v4.generate_presigned_post(Bucket="acl-private", Key="posted/bob.bin")
status, _, body = post_form(theirs["url"], theirs["fields"], "b.bin", b"b")
assert status == 403 and error_code(body) == "AccessDenied", (status, body)
s3.put_bucket_acl(Bucket="acl-open", ACL="public-read-write")
status, _, body = post_form(f"{EP}/acl-open", {"key": "anon/${filename}"}, "hello.txt", b"anonymous form")
assert status == 204, (status, body)
assert s3.get_object(Bucket="acl-open", Key="anon/hello.txt")["Body"].read() == b"anonymous form"
status, _, body = post_form(f"{EP}/acl-private", {"key": "anon.txt"}, "a.txt", b"a")
assert status == 403 and error_code(body) == "AccessDenied", (status, body)
expired = s3_v4.generate_presigned_post(Bucket="acl-private", Key="posted/late.bin", ExpiresIn=1)
time.sleep(2.2)
status, _, body = post_form(expired["url"], expired["fields"], "late.bin", b"late")
assert status == 403 and error_code(body) == "AccessDenied", (status, body)
for k in ("posted/small.bin", "elsewhere/small.bin", "posted/bob.bin", "anon.txt", "posted/late.bin"):
    expect_error("404", s3.head_object, Bucket="acl-private", Key=k)
print("ACL / CORS / POST suite passed", flush=True)
