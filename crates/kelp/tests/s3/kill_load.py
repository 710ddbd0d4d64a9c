"""`load`: upload objects (single PUTs and multipart) through one gateway until it dies, then
write the acknowledged keys and their MD5s to ACKED (JSON). `verify`: check through another
gateway that every acknowledged object reads back exactly.
Environment: AWS keys, ENDPOINT, BUCKET, ACKED."""
import hashlib
import http.client
import json
import urllib.parse
import os
import sys
import threading

import boto3
from botocore.config import Config

mode = sys.argv[1]
cfg = Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1},
             connect_timeout=2, read_timeout=10)
s3 = boto3.client("s3", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1", config=cfg)
bucket = os.environ["BUCKET"]
acked_file = os.environ["ACKED"]

if mode == "verify":
    acked = json.load(open(acked_file))
    assert acked, "nothing was acknowledged before the gateway died"
    for key, md5 in acked.items():
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert hashlib.md5(body).hexdigest() == md5, f"{key} differs"
    print(f"verified {len(acked)} objects")
    sys.exit(0)

acked = {}
errors = []
lock = threading.Lock()


def worker(t):
    i = 0
    while True:
        key = f"k{t}/{i}"
        data = os.urandom(3 * 1024 * 1024 if i % 2 else 9 * 1024 * 1024)
        try:
            if i % 4 == 2:  # a 9 MiB object, in two parts
                up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
                half = 5 * 1024 * 1024
                e1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=data[:half])["ETag"]
                e2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=2, Body=data[half:])["ETag"]
                s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload={
                    "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
            else:
                s3.put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{key}: {e}")
            return
        with lock:
            acked[key] = hashlib.md5(data).hexdigest()
        i += 1


# one upload that is surely in the middle of its body when the gateway dies: a presigned PUT
# that sends its headers and 1 MiB of an announced 9 MiB, then waits
url = urllib.parse.urlsplit(s3.generate_presigned_url(
    "put_object", Params={"Bucket": bucket, "Key": "stalled"}, ExpiresIn=600))
stalled = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
stalled.putrequest("PUT", f"{url.path}?{url.query}", skip_accept_encoding=True)
stalled.putheader("Content-Length", str(9 * 1024 * 1024))
stalled.endheaders()
stalled.send(os.urandom(1024 * 1024))

threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
for th in threads:
    th.start()
for th in threads:
    th.join()
stalled.close()
json.dump(acked, open(acked_file, "w"))
# every worker must have stopped because the gateway died, not for another reason
for e in errors:
    low = e.lower()
    assert any(w in low for w in ("connect", "closed", "reset", "aborted", "broken pipe")), e
print(f"acknowledged {len(acked)} objects before the gateway died")
