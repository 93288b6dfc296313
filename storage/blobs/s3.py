"""A blob store on any S3-compatible endpoint (AWS S3, SeaweedFS, MinIO) through boto3."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import boto3
from boto3.exceptions import Boto3Error
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from enginefarm.core.config import Settings
from enginefarm.core.errors import InfrastructureError, IntegrityError, NotFound
from enginefarm.core.hashing import sha256_file
from storage.blobs.base import CHUNK, BlobObject, BlobStore, PartialUpload
from storage.metrics import BLOB_ERRORS

# Multipart above 64 MiB, in 64 MiB parts: big engines stream without being held in memory.
STREAMS = 64  # S3 connections kept per process (botocore keeps 10)
TRANSFER = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4)
NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
GONE_UPLOAD_CODES = {"404", "NoSuchUpload"}


def _utc(value: datetime) -> datetime:
    """boto3 hands back aware datetimes, sometimes in local time; the collector compares in UTC."""
    return value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)


@contextmanager
def _mapped(key: str):
    """Translate boto3's errors once, here: a missing key is NotFound, anything else is transient."""
    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in NOT_FOUND_CODES:
            raise NotFound(f"blob {key} is missing from the store") from exc
        BLOB_ERRORS.labels("s3").inc()
        raise InfrastructureError(f"S3 error on {key}: {code or exc}") from exc
    except BotoCoreError as exc:
        BLOB_ERRORS.labels("s3").inc()
        raise InfrastructureError(f"S3 unreachable while handling {key}: {exc}") from exc
    except (
        Boto3Error
    ) as exc:  # upload_file/download_file wrap client errors (S3UploadFailedError, RetriesExceededError)
        BLOB_ERRORS.labels("s3").inc()
        raise InfrastructureError(f"S3 transfer of {key} failed: {exc}") from exc


class S3BlobStore(BlobStore):
    def __init__(self, client, bucket: str):
        self.client = client
        self.bucket = bucket

    @classmethod
    def from_settings(cls, settings: Settings) -> S3BlobStore:
        client = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.s3_region,
            aws_access_key_id=settings.s3_access_key,
            aws_secret_access_key=settings.s3_secret_key,
            # One client per process serves every download the API streams at once: keep that many connections.
            config=Config(
                retries={"max_attempts": 5, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                max_pool_connections=STREAMS,
                s3={"addressing_style": "path"},
            ),
        )
        store = cls(client, settings.s3_bucket)
        store.ensure_bucket()
        return store

    def ensure_bucket(self) -> None:
        with _mapped(self.bucket):
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code")) not in NOT_FOUND_CODES:
                    raise
                self.client.create_bucket(Bucket=self.bucket)

    def _head(self, key: str) -> dict:
        with _mapped(key):
            return self.client.head_object(Bucket=self.bucket, Key=key)

    def put_file(self, key: str, path: Path, sha256: str, *, hashed: bool = False) -> None:
        size = Path(path).stat().st_size
        try:
            head = self._head(key)
            if head["ContentLength"] == size and head.get("Metadata", {}).get("sha256") == sha256:
                self._touch(key, sha256)  # content-addressed: already stored
                return
        except NotFound:  # never stored, or collected between the check and the touch
            pass
        # Verify the bytes before they go up (unless the caller hashed this very file): the metadata only
        # repeats what we claim, so a check after the upload could not catch a mismatch.
        if not hashed and (got := sha256_file(Path(path))) != sha256:
            raise IntegrityError(f"blob {key}: file has sha256 {got}, expected {sha256}; nothing uploaded")
        with _mapped(key):
            # S3 makes an object visible only once every part is in: no reader sees a half blob.
            self.client.upload_file(
                str(path), self.bucket, key, Config=TRANSFER, ExtraArgs={"Metadata": {"sha256": sha256}}
            )
        if hashed:  # the upload succeeded whole; the read-back below only guards a sha256 nobody computed here
            return
        head = self._head(key)
        if head["ContentLength"] != size or head.get("Metadata", {}).get("sha256") != sha256:
            raise IntegrityError(
                f"blob {key}: stored {head['ContentLength']} bytes, expected {size} with sha256 {sha256}"
            )

    def _touch(self, key: str, sha256: str) -> None:
        """Refresh the object's LastModified with a server-side copy onto itself (S3 has no cheaper way):
        a new row is about to point at it, so the collector's grace period must start again now."""
        with _mapped(key):
            self.client.copy(
                {"Bucket": self.bucket, "Key": key},
                self.bucket,
                key,
                Config=TRANSFER,
                ExtraArgs={"Metadata": {"sha256": sha256}, "MetadataDirective": "REPLACE"},
            )

    def get_file(self, key: str, dest: Path) -> None:
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".incoming-")
        os.close(fd)
        try:
            with _mapped(key):
                self.client.download_file(self.bucket, key, tmp, Config=TRANSFER)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def iter_chunks(
        self, key: str, chunk_size: int = CHUNK, start: int = 0, end: int | None = None
    ) -> Generator[bytes, None, None]:
        ranged = {"Range": f"bytes={start}-{'' if end is None else end}"} if start or end is not None else {}
        with _mapped(key):
            body = self.client.get_object(Bucket=self.bucket, Key=key, **ranged)["Body"]
        try:
            with _mapped(key):
                yield from body.iter_chunks(chunk_size)
        finally:
            body.close()

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
            return True
        except NotFound:
            return False

    def size(self, key: str) -> int:
        return int(self._head(key)["ContentLength"])

    def delete(self, key: str) -> None:
        with _mapped(key):
            self.client.delete_object(Bucket=self.bucket, Key=key)

    def objects(self, prefix: str = "") -> Iterator[BlobObject]:
        paginator = self.client.get_paginator("list_objects_v2")
        with _mapped(prefix or self.bucket):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    yield BlobObject(obj["Key"], int(obj["Size"]), _utc(obj["LastModified"]))

    def stat(self, key: str) -> BlobObject | None:
        try:
            head = self._head(key)
        except NotFound:
            return None
        return BlobObject(key, int(head["ContentLength"]), _utc(head["LastModified"]))

    def partial_uploads(self) -> Iterator[PartialUpload]:
        """Unfinished multipart uploads (a killed process leaves its parts, billed, invisible to listings);
        their progress is the newest part's time, or the start when no part arrived."""
        paginator = self.client.get_paginator("list_multipart_uploads")
        with _mapped(self.bucket):
            for page in paginator.paginate(Bucket=self.bucket):
                for upload in page.get("Uploads", []):
                    key, upload_id = upload["Key"], upload["UploadId"]
                    size, modified = 0, _utc(upload["Initiated"])
                    try:
                        for parts in self.client.get_paginator("list_parts").paginate(
                            Bucket=self.bucket, Key=key, UploadId=upload_id
                        ):
                            for part in parts.get("Parts", []):
                                size += int(part["Size"])
                                modified = max(modified, _utc(part["LastModified"]))
                    except ClientError as exc:
                        if str(exc.response.get("Error", {}).get("Code", "")) in GONE_UPLOAD_CODES:
                            continue  # completed or aborted since the listing
                        raise
                    yield PartialUpload(key, size, modified, upload_id)

    def discard_partial(self, partial: PartialUpload) -> None:
        # The writer, if it is still alive, fails at its next part or at completion: nothing is stored.
        with _mapped(partial.key):
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=partial.key, UploadId=partial.upload_id)
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code", "")) not in GONE_UPLOAD_CODES:
                    raise

    def download_url(self, key: str, expires_seconds: int, filename: str | None = None) -> str:
        return self.presigned_url(key, expires_seconds, filename)

    def presigned_url(self, key: str, expires_seconds: int = 300, filename: str | None = None) -> str:
        params = {"Bucket": self.bucket, "Key": key}
        if filename:
            params["ResponseContentDisposition"] = f'attachment; filename="{filename}"'
        with _mapped(key):
            return self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_seconds)
