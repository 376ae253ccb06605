"""Minimal ``multipart/form-data`` parsing for file uploads (stdlib ``email`` parser).

FastAPI's own form support needs the ``python-multipart`` package, which the project
does not depend on; uploads are small (JSONL training files), so parsing the whole
body with the standard library is enough.
"""

from __future__ import annotations

from dataclasses import dataclass
from email import policy
from email.parser import BytesParser


@dataclass(frozen=True)
class FormField:
    name: str
    filename: str | None
    data: bytes


class MultipartError(ValueError):
    """The body is not a usable ``multipart/form-data`` message."""


def parse_form(content_type: str, body: bytes) -> dict[str, FormField]:
    """Fields of a ``multipart/form-data`` body, by name."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise MultipartError(f"expected multipart/form-data, got {content_type or 'no content type'}")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise MultipartError("malformed multipart body")
    fields: dict[str, FormField] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        data = part.get_payload(decode=True) or b""
        fields[str(name)] = FormField(name=str(name), filename=part.get_filename(), data=data)
    return fields
