"""SIP messages (RFC 3261 section 7): parse a datagram into a Request or Response, and back.

Parsing is strict where a wrong guess would be dangerous (the start line, Content-Length,
the headers a transaction needs) and lenient where real phones differ (header case, compact
header names, folded lines, a missing Content-Length over UDP). Anything Parley cannot
read raises SipParseError, whose text is safe to put in a 400's reason phrase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Union

SIP_VERSION = "SIP/2.0"
MAX_MESSAGE_BYTES = 65535  # one UDP datagram; anything bigger is not SIP over UDP
MAX_HEADERS = 128  # more is an attack or a broken peer, not a phone
BRANCH_MAGIC = "z9hG4bK"  # RFC 3261 branch prefix (section 8.1.1.7)

# Compact forms (RFC 3261 section 7.3.3 and extensions): what a phone may send instead.
COMPACT_NAMES = {"i": "call-id", "m": "contact", "e": "content-encoding", "l": "content-length",
                 "c": "content-type", "f": "from", "s": "subject", "k": "supported", "t": "to",
                 "v": "via", "r": "refer-to", "b": "referred-by", "o": "event", "u": "allow-events"}
REQUIRED_HEADERS = ("via", "from", "to", "call-id", "cseq")
TOKEN = re.compile(r"^[A-Za-z0-9\-.!%*_+`'~]+$")
REQUEST_LINE = re.compile(r"^([A-Za-z0-9\-.!%*_+`'~]+) (\S+) SIP/2\.0$")
STATUS_LINE = re.compile(r"^SIP/2\.0 ([1-6][0-9][0-9]) ?(.*)$")

REASONS = {100: "Trying", 180: "Ringing", 200: "OK", 202: "Accepted", 400: "Bad Request",
           401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           407: "Proxy Authentication Required", 415: "Unsupported Media Type", 420: "Bad Extension",
           481: "Call/Transaction Does Not Exist", 486: "Busy Here", 487: "Request Terminated",
           488: "Not Acceptable Here", 491: "Request Pending", 500: "Server Internal Error",
           501: "Not Implemented", 503: "Service Unavailable", 603: "Decline"}


class SipParseError(ValueError):
    """The bytes are not a SIP message Parley can act on; the text says why."""


class Headers:
    """Case-insensitive, ordered, multi-valued SIP headers (names stored lower-case, compact
    names expanded), so `headers.get("Via")` finds a `v:` header too."""

    def __init__(self, items: Optional[list[tuple[str, str]]] = None) -> None:
        self._items: list[tuple[str, str]] = []
        for name, value in items or []:
            self.add(name, value)

    @staticmethod
    def canonical(name: str) -> str:
        lower = name.strip().lower()
        return COMPACT_NAMES.get(lower, lower)

    def add(self, name: str, value: str) -> None:
        self._items.append((self.canonical(name), value.strip()))

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:
        key = self.canonical(name)
        return next((v for n, v in self._items if n == key), default)

    def get_all(self, name: str) -> list[str]:
        """Every value of the header, with comma-joined values split (Via: a, b is two Vias)."""
        key = self.canonical(name)
        values: list[str] = []
        for n, v in self._items:
            if n == key:
                values += split_commas(v) if key in ("via", "route", "record-route", "contact") else [v]
        return values

    def set(self, name: str, value: str) -> None:
        self.remove(name)
        self.add(name, value)

    def remove(self, name: str) -> None:
        key = self.canonical(name)
        self._items = [(n, v) for n, v in self._items if n != key]

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def copy(self) -> "Headers":
        return Headers(self.items())


def split_commas(value: str) -> list[str]:
    """Split a header value at commas outside quotes and <angle brackets>."""
    parts, current, quoted, angled = [], [], False, False
    for ch in value:
        if ch == '"':
            quoted = not quoted
        elif ch == "<" and not quoted:
            angled = True
        elif ch == ">" and not quoted:
            angled = False
        if ch == "," and not quoted and not angled:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


@dataclass
class Message:
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""

    @property
    def call_id(self) -> str:
        return self.headers.get("call-id") or ""

    @property
    def cseq(self) -> tuple[int, str]:
        """(number, method) of the CSeq header."""
        return parse_cseq(self.headers.get("cseq") or "")

    @property
    def top_via(self) -> str:
        vias = self.headers.get_all("via")
        return vias[0] if vias else ""

    @property
    def branch(self) -> str:
        return header_params(self.top_via).get("branch", "")

    @property
    def content_type(self) -> str:
        return (self.headers.get("content-type") or "").split(";")[0].strip().lower()

    def _serialize(self, start_line: str) -> bytes:
        headers = self.headers.copy()
        headers.set("content-length", str(len(self.body)))
        lines = [start_line] + [f"{_display_name(n)}: {v}" for n, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + self.body


@dataclass
class Request(Message):
    method: str = ""
    uri: str = ""

    def to_bytes(self) -> bytes:
        return self._serialize(f"{self.method} {self.uri} {SIP_VERSION}")


@dataclass
class Response(Message):
    status: int = 200
    reason: str = ""

    def to_bytes(self) -> bytes:
        return self._serialize(f"{SIP_VERSION} {self.status} {self.reason or REASONS.get(self.status, '')}")


SipMessage = Union[Request, Response]


def _display_name(name: str) -> str:
    special = {"call-id": "Call-ID", "cseq": "CSeq", "www-authenticate": "WWW-Authenticate"}
    return special.get(name, "-".join(part.capitalize() for part in name.split("-")))


def parse_cseq(value: str) -> tuple[int, str]:
    parts = value.split()
    if len(parts) != 2 or not parts[0].isdigit() or len(parts[0]) > 10 or not TOKEN.match(parts[1]):
        raise SipParseError(f"bad CSeq {value!r}")
    number = int(parts[0])
    if number >= 2 ** 31:
        raise SipParseError("CSeq number out of range")
    return number, parts[1].upper()


def header_params(value: str) -> dict[str, str]:
    """`;name=value` parameters after the address part (`<sip:a@b>;tag=x` -> {"tag": "x"})."""
    tail = value.rsplit(">", 1)[1] if ">" in value else value
    params = {}
    for part in tail.split(";")[1:]:
        name, _, val = part.partition("=")
        if name.strip():
            params[name.strip().lower()] = val.strip().strip('"')
    return params


def address_uri(value: str) -> str:
    """The URI of a name-addr or addr-spec (`"Bob" <sip:bob@x>;tag=1` -> `sip:bob@x`)."""
    if "<" in value and ">" in value:
        return value[value.index("<") + 1:value.index(">")].strip()
    return value.split(";")[0].strip()


def parse(data: bytes) -> SipMessage:
    """One SIP message from one datagram; SipParseError says what is wrong."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError("message too large")
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        head, sep, body = data.partition(b"\n\n")  # bare-LF peers exist; RFC 3261 7.5 tolerates them
    if not sep:
        raise SipParseError("no blank line after the headers")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError("headers are not UTF-8") from None
    lines = text.replace("\r\n", "\n").split("\n")
    start = lines[0].strip()
    message: SipMessage
    if request := REQUEST_LINE.match(start):
        message = Request(method=request.group(1).upper(), uri=request.group(2))
    elif status := STATUS_LINE.match(start):
        message = Response(status=int(status.group(1)), reason=status.group(2))
    else:
        raise SipParseError("bad start line")
    _parse_headers(lines[1:], message.headers)
    for name in REQUIRED_HEADERS:
        if name not in message.headers:
            raise SipParseError(f"missing {name} header")
    number, method = message.cseq
    if isinstance(message, Request) and method != message.method and message.method not in ("ACK", "CANCEL"):
        raise SipParseError("CSeq method does not match the request method")
    message.body = _body(message.headers, body)
    return message


def _parse_headers(lines: list[str], headers: Headers) -> None:
    unfolded: list[str] = []
    for line in lines:
        if line[:1] in (" ", "\t") and unfolded:  # a folded continuation (RFC 3261 7.3.1)
            unfolded[-1] += " " + line.strip()
        elif line.strip():
            unfolded.append(line)
    if len(unfolded) > MAX_HEADERS:
        raise SipParseError("too many headers")
    for line in unfolded:
        name, sep, value = line.partition(":")
        if not sep or not TOKEN.match(name.strip()):
            raise SipParseError("bad header line")
        headers.add(name, value)


def _body(headers: Headers, body: bytes) -> bytes:
    length = headers.get("content-length")
    if length is None:
        return body  # allowed over UDP: the body is the rest of the datagram
    if not length.isdigit():
        raise SipParseError("bad Content-Length")
    if int(length) > len(body):
        raise SipParseError("Content-Length is longer than the body")
    return body[:int(length)]
