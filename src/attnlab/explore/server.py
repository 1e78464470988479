"""``attnlab explore RUN --serve``: the explorer page on a local server that recomputes the
attention for new input.

The server listens on 127.0.0.1 only and answers two things: ``GET /`` (the page, with the input
form, showing the given input or the run's default one) and ``POST /api/explore`` (JSON
``{"text"}`` or ``{"image": data URL, "image_name"}``, plus ``"question"`` for VQA, and
``"ablate": {layer: [head, ...]}`` to zero-ablate heads) with the new payload. Every bad request
gets a 4xx status and ``{"error": message}`` (a body that is not a JSON object, unknown fields,
wrong types, a missing or oversized body, an unknown path or method, input the model cannot
read), and the server keeps serving; a 500 is a bug in attnlab. Bodies are bounded; requests
whose ``Host`` is not this machine's loopback name are refused (a web page cannot reach the
server through a rebound domain name). Nothing is written anywhere: the model only reads.
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import logging
import re
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from attnlab.errors import UserError
from attnlab.explore.explorer import ExploreInput, Explorer
from attnlab.explore.heads import ablation_from_json
from attnlab.explore.images import MAX_IMAGE_BYTES
from attnlab.explore.page import render_page
from attnlab.explore.text import MAX_CHARS

__all__ = ["make_server", "parse_body", "BadRequest", "FIELDS", "MAX_BODY_BYTES"]

log = logging.getLogger(__name__)

#: largest request body (an image as a base64 data URL, plus the question)
MAX_BODY_BYTES = MAX_IMAGE_BYTES * 4 // 3 + 64 * 1024
_DATA_URL = re.compile(r"^data:[\w/+.-]*(;[\w=.-]+)*;base64,", re.ASCII)


#: the fields a request body may have
FIELDS = ("text", "image", "image_name", "question")
#: seconds a client may take to send its request (a body shorter than its Content-Length waits)
REQUEST_TIMEOUT = 30


class BadRequest(Exception):
    """A request the server refuses: an HTTP status (4xx) and one line for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_body(data: bytes) -> dict:
    """The JSON object of a request body.

    Raises:
        BadRequest: an empty body, bytes that are not UTF-8 JSON, JSON nested too deeply, or a
            value that is not an object.
    """
    if not data.strip():
        raise BadRequest(400, 'the request body is empty: send a JSON object such as {"text": ...}')
    try:
        body = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest(400, "the request is not UTF-8 text") from None
    except RecursionError:
        raise BadRequest(400, "the request's JSON is nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, or an integer too long to read
        raise BadRequest(400, f"the request is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, f"the request must be a JSON object, not {type(body).__name__}")
    return body


def _input_from_json(body: dict) -> ExploreInput:
    """The :class:`ExploreInput` of a request body.

    Raises:
        UserError: unknown fields, fields of the wrong type, text that is not valid Unicode, or
            an image that is not base64 data.
    """
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise UserError(
            f"unknown field {unknown[0]!r} in the request; the fields are {', '.join(FIELDS)}"
        )
    for key in FIELDS:
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            raise UserError(f"{key} must be a string, not {type(value).__name__}")
        try:
            (value or "").encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"{key} is not valid Unicode (a lone surrogate)") from None
    text, image, question = body.get("text"), body.get("image"), body.get("question")
    name = body.get("image_name") or "the uploaded image"
    data = None
    if image is not None:
        m = _DATA_URL.match(image)
        try:
            data = base64.b64decode(image[m.end() if m else 0 :], validate=True)
        except (binascii.Error, ValueError):
            raise UserError(f"{name} is not base64 image data") from None
    return ExploreInput(
        text=text, image=data, image_name=str(name)[:200], question=question or None
    )


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "attnlab-explore"
    timeout = REQUEST_TIMEOUT  # a stalled client cannot hold a thread forever

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value) -> None:
        self._send(status, json.dumps(value, allow_nan=False).encode(), "application/json")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None):
        """Every refusal of the base class (a malformed request line or header, an unknown
        method) as JSON; an unknown method is 405, not 501."""
        if code == HTTPStatus.NOT_IMPLEMENTED:  # no do_<METHOD>
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command} not allowed"
        try:
            default = HTTPStatus(code).phrase
        except ValueError:
            default = "error"
        self.log_error("code %d, message %s", code, message)
        self.close_connection = True
        if not getattr(self, "request_version", None) or self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # headers still go out (the base class's HTTP/0.9)
        self._json(code, {"error": message or default})

    def _host_ok(self) -> bool:
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()
        return host in ("127.0.0.1", "localhost", "::1")

    def _refuse(self, err: BadRequest) -> None:
        self.close_connection = True
        self._json(err.status, {"error": str(err)})

    def do_GET(self) -> None:
        if not self._host_ok():
            return self._refuse(BadRequest(HTTPStatus.FORBIDDEN, "forbidden host"))
        if self.path.split("?", 1)[0] not in ("/", "/index.html"):
            return self._refuse(BadRequest(HTTPStatus.NOT_FOUND, f"not found: {self.path[:100]}"))
        srv = self.server
        page = render_page(srv.payload, serve=srv.form)
        self._send(HTTPStatus.OK, page.encode("utf-8"), "text/html; charset=utf-8")

    do_HEAD = do_GET

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise BadRequest(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length")
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise BadRequest(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
        try:
            length = int(raw)
        except ValueError:
            raise BadRequest(400, f"Content-Length is not a number: {raw[:40]!r}") from None
        if length < 0:
            raise BadRequest(400, f"Content-Length is negative: {length}")
        if length > MAX_BODY_BYTES:
            raise BadRequest(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"the input is larger than {MAX_BODY_BYTES // 2**20} MB",
            )
        try:
            data = self.rfile.read(length)
        except TimeoutError:
            raise BadRequest(
                HTTPStatus.REQUEST_TIMEOUT, "the request body did not arrive"
            ) from None
        if len(data) < length:
            raise BadRequest(400, "the request body is shorter than its Content-Length")
        return data

    def do_POST(self) -> None:
        try:
            if not self._host_ok():
                raise BadRequest(HTTPStatus.FORBIDDEN, "forbidden host")
            if self.path.split("?", 1)[0] != "/api/explore":
                raise BadRequest(HTTPStatus.NOT_FOUND, f"not found: {self.path[:100]}")
            body = parse_body(self._read_body())
            ablate = ablation_from_json(body)  # (attnlab.explore.heads)
            inp = _input_from_json({k: v for k, v in body.items() if k != "ablate"})
        except BadRequest as err:
            return self._refuse(err)
        except UserError as err:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": str(err)})
        try:
            payload = self.server.explorer.explain(inp, ablate=ablate)
        except (UserError, ValueError) as err:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": str(err)})
        except Exception as err:  # a bug: say so on the page, keep serving
            log.exception("explore failed")
            return self._json(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"error": f"internal error: {type(err).__name__}: {err}"},
            )
        self._json(HTTPStatus.OK, payload)

    def do_PUT(self) -> None:
        self.send_error(HTTPStatus.NOT_IMPLEMENTED)  # answered as 405 by send_error

    do_DELETE = do_PATCH = do_OPTIONS = do_PUT


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that went away (a reset, a broken pipe, a timeout) is one debug line, not a
        traceback on the console; anything else is logged as a bug."""
        err = sys.exc_info()[1]
        if isinstance(err, (ConnectionError, TimeoutError)):
            log.debug("%s: %s", client_address[0], err)
        else:
            log.exception("request from %s failed", client_address[0])

    def __init__(self, port: int, explorer: Explorer, payload: dict | None) -> None:
        self.explorer, self.payload = explorer, payload
        self.form = {
            "input": explorer.input_kind,
            "question": explorer.takes_question,
            "max_chars": MAX_CHARS,
            "max_image_bytes": MAX_IMAGE_BYTES,
            "placeholder": explorer.placeholder,
        }
        super().__init__(("127.0.0.1", port), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


def make_server(
    explorer: Explorer, *, port: int = 8000, first: ExploreInput | None = None
) -> _Server:
    """A server for ``explorer`` on ``127.0.0.1:port`` (0: any free port); call
    ``serve_forever()`` on it, ``url`` says where it is.

    Args:
        first: the input shown when the page opens; None: the run's default input
            (:meth:`Explorer.default_input`: a sentence its vocabulary reads, a bundled or
            generated image), or the bare form when it has none.

    Raises:
        UserError: a bad first input; the port is in use, not allowed, or out of range.
    """
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {port}")
    if first is not None:
        payload = explorer.explain(first)
    else:
        payload = None
        try:
            default = explorer.default_input()
            payload = explorer.explain(default) if default is not None else None
        except UserError as err:  # an unusual vocabulary: the page opens with the form alone
            log.debug("no default input: %s", err)
    try:
        return _Server(port, explorer, payload)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} on 127.0.0.1 is in use: choose another with --port"
            ) from None
        if err.errno == errno.EACCES:
            raise UserError(
                f"port {port} needs privileges: choose one above 1023 with --port"
            ) from None
        raise
