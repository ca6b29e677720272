"""A fuzz pass over the LLM request fields and what a worker reads back (issue 39 point 7): generated
``measurement.llm`` settings with endpoints and credential names, token bounds against generated contexts, the
egress policy over generated endpoints, allowlists and resolver answers, the credential map's text, and generated
server answers (HTTP heads, chunked bodies, server-sent events). Each either works or fails with farm's own
one-line error, never another exception; a refused address is never pinned; a credential's value never appears
in an error; a response body is never kept past its cap. Outcomes are tallied by kind and printed (``pytest -s``).
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from farm import egress
from farm.errors import ConfigError, CredentialError, EgressError, RequestError
from farm.secrets import credentials
from farm.settings import reset_settings
from farm.workload_files import check_prompt_bounds
from schemas import ProfileRequest
from workers.loadgen.openai.http_stream import Lost, ProtocolError, Reply, _Conn
from workers.loadgen.openai.stream import RawRequest, replay

TALLY: Counter[str] = Counter()
NASTY = list("0123456789abcxyz:/.-_@[]%?#=,; \t\x00\x1b\u202e\u00e9")
TEXT = st.text(alphabet=st.sampled_from(NASTY), max_size=40)
NUMBER = st.one_of(st.integers(-2**40, 2**40), st.floats(allow_nan=True, allow_infinity=True))
TOKENS = st.one_of(NUMBER, TEXT, st.sampled_from(["128", "128/32", "64:256", "1000000", "0:0", "9:2", "1e9",
                                                  "20000/1000000", "-1"]))
LLM_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "api": st.sampled_from(["openai-chat", "openai-completions", "kserve", ""]),
    "credential": st.one_of(TEXT, st.sampled_from(["prod", "a" * 65, "../etc", "k.e-y_1"])),
    "api_key_env": st.sampled_from(["HOME", "FARM_DATABASE_URL"]),
    "input_tokens": TOKENS, "output_tokens": TOKENS, "prefix_tokens": NUMBER, "seed": NUMBER,
    "prompts": st.one_of(TEXT, st.sampled_from(["/etc/passwd", "/proc/self/environ", ""]),
                         st.fixed_dictionaries({"kind": st.sampled_from(["prompts", "trace", "x"]),
                                                "sha256": st.sampled_from(["0" * 64, "z" * 64, ""]),
                                                "filename": st.sampled_from(["p.jsonl", "../x", ".", "a/b"]),
                                                "size_bytes": NUMBER})),
    "tokenizer": st.one_of(TEXT, st.sampled_from(["/etc/shadow", "tok.json"])),
    "slo": st.one_of(TEXT, st.sampled_from(["ttft=200,tpot=50", "ttfb=1", "ttft=-1"])),
    "requests": NUMBER, "warmup_requests": NUMBER, "request_timeout_s": NUMBER,
    "base_path": st.one_of(TEXT, st.sampled_from(["/v1", "/v1?x=1", "/../admin"])), "tls": st.booleans(),
    "bogus": TEXT,
}
#: mostly valid settings: the token fields in range, one or two other fields generated as above
NEAR_VALID = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries({"api": st.sampled_from(["openai-chat", "openai-completions"]),
                           "input_tokens": st.one_of(st.integers(0, 2_000_000), st.sampled_from(["64:256", "128/32"])),
                           "output_tokens": st.integers(0, 2_000_000), "prefix_tokens": st.integers(0, 2_000_000)}),
    st.one_of(st.just({}), st.dictionaries(st.sampled_from(sorted(LLM_FIELDS)),
                                           st.deferred(lambda: st.one_of(*LLM_FIELDS.values())), max_size=1)))
ENDPOINT = st.one_of(st.sampled_from(["http://127.0.0.1:8000", "https://llm.internal/v1", "http://[::1]:9000/x"]),
                     TEXT, st.sampled_from([
    "http://127.0.0.1:8000/v1", "http://169.254.169.254:80", "http://[::1]:8000", "http://[fe80::1%25eth0]:80",
    "https://llm.internal:443/v1", "http://0.0.0.0:80", "http://user:pw@h:1", "http://h:99999", "h:80",
    "http://[::ffff:169.254.169.254]:80", "http://2130706433:80"]))
ADDRESS = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6),
                    st.sampled_from([ipaddress.ip_address(a) for a in ("169.254.169.254", "127.0.0.1", "10.1.2.3",
                                                                        "::ffff:169.254.169.254", "fd00:ec2::254")]))
ALLOW = st.lists(st.sampled_from(["*", "10.0.0.0/8", "127.0.0.1:8000", "localhost", "[::1]:8000", "h.test",
                                  "169.254.0.0/16", "0.0.0.0/0", "bad/99", "x:0", "[fe80::/10]:80"]), max_size=4)


@pytest.fixture(scope="module", autouse=True)
def report_tally() -> Iterator[None]:
    yield
    print("\nLLM fuzz outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(TALLY.items())))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.fixed_dictionaries({}, optional=LLM_FIELDS), NEAR_VALID, NEAR_VALID), ENDPOINT,
       st.one_of(st.none(), st.integers(-5, 10**7)), st.lists(st.integers(-3, 5000), max_size=3))
def test_llm_request_fields_validate_or_say_why(llm: dict[str, Any], endpoint: str, context: int | None,
                                                 concurrency: list[int]) -> None:
    data: dict[str, Any] = {"endpoint": endpoint, "model_name": "m", "measurement": {"llm": llm}}
    if concurrency:
        data["concurrency"] = concurrency
    try:
        req = ProfileRequest.model_validate(data)
    except ValidationError as exc:
        assert exc.errors()
        TALLY["request: refused by the schema"] += 1
        return
    got = req.measurement.llm
    assert got is not None and req.endpoint is not None
    assert got.credential is None or (len(got.credential) <= 64 and "/" not in got.credential)
    assert got.base_path.startswith("/") and not any(c in got.base_path for c in " ?#\x00")
    TALLY["request: valid"] += 1
    try:
        check_prompt_bounds(got, context if context and context > 0 else None)
        TALLY["bounds: within"] += 1
    except RequestError as exc:
        assert "\n" not in str(exc)
        TALLY["bounds: refused"] += 1


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ENDPOINT, st.lists(ADDRESS, min_size=0, max_size=3), ALLOW, st.booleans())
def test_the_egress_policy_never_pins_a_refused_address(monkeypatch: pytest.MonkeyPatch, endpoint: str,
                                                       answers: list[Any], allow: list[str], cluster: bool) -> None:
    def resolve(host: str, port: int, **_: object) -> list[tuple[Any, ...]]:
        if not answers:
            raise socket.gaierror("no such name")
        return [(socket.AF_INET6 if a.version == 6 else socket.AF_INET, socket.SOCK_STREAM, 6, "", (str(a), port))
                for a in answers]

    with monkeypatch.context() as m:
        m.setattr(socket, "getaddrinfo", resolve)
        m.setenv("FARM_ENDPOINT_ALLOW", ",".join(allow))
        if cluster:
            m.setenv("FARM_BROKER_URL", "redis://10.9.9.9:6379/0")
        reset_settings()
        hostport = endpoint.split("://", 1)[-1].split("/", 1)[0]
        try:
            pinned = egress.pin(hostport)
        except EgressError as exc:
            assert "\n" not in str(exc)
            TALLY["egress: refused"] += 1
            return
        finally:
            reset_settings()
    address = ipaddress.ip_address(pinned.address)
    assert address not in egress.METADATA and not address.is_link_local and not address.is_unspecified
    assert not (cluster and not [a for a in allow if a.strip()])
    if address.is_loopback:
        assert not cluster or any(a in allow for a in ("127.0.0.1:8000", "localhost", "[::1]:8000"))
    TALLY["egress: pinned"] += 1


@settings(max_examples=300, deadline=None)
@given(st.one_of(TEXT, st.builds(lambda n, k, r: f"{n}={k}:{r}", TEXT, st.sampled_from(["env", "file", "x"]), TEXT),
                 st.sampled_from(['{"a": {"env": "X"}}', '{"a": 1}', "[1]", '{"a b": {"file": "/k"}}', "{"])))
def test_the_credential_map_parses_or_says_why(text: str) -> None:
    try:
        found = credentials(text)
    except ConfigError as exc:
        assert "FARM_ENDPOINT_CREDENTIALS" in str(exc) and "\n" not in str(exc)
        TALLY["credentials: refused"] += 1
        return
    for cred in found.values():
        try:
            cred.read()
        except CredentialError as exc:
            assert "\n" not in str(exc)
    TALLY["credentials: parsed"] += 1


HEAD = st.sampled_from([b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
                        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b"HTTP/1.0 500 X\r\n\r\n",
                        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
                        b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
BODY = st.lists(st.one_of(st.binary(max_size=64), st.sampled_from([
    b"5\r\nhello\r\n", b"0\r\n\r\n", b"ffffffffffffffff\r\n",
    b"data: {\"choices\": [{\"delta\": {\"content\": \"x\"}}]}\n\n",
    b"data: [DONE]\n\n", b"data: {not json\n\n", b"data: " + b"\xff" * 10 + b"\n"])), max_size=8)


@settings(max_examples=400, deadline=None)
@given(HEAD, BODY, st.integers(1, 4096))
def test_server_answers_parse_or_fail_within_the_cap(head: bytes, body: list[bytes], cap: int) -> None:
    """What an endpoint (or a jailed server) answers reaches farm's parser: it ends, fails or is cut at the cap,
    never raises anything else, never keeps more than the cap."""
    conn = _Conn(drain_s=0.01, max_body=cap)
    pieces: list[tuple[float, bytes]] = []

    class Transport(asyncio.Transport):
        def write(self, data: bytes | bytearray | memoryview) -> None:
            return None

        def close(self) -> None:
            return None

        def is_closing(self) -> bool:
            return False

    async def feed() -> Reply:
        conn.connection_made(Transport())
        waiter = conn.send(b"", pieces)
        for data in [head, *body]:
            if conn.state != "idle":
                conn.data_received(data)
        if not waiter.done():
            conn.connection_lost(None)
        return await waiter

    try:
        asyncio.run(feed())
    except (ProtocolError, Lost) as exc:
        TALLY[f"answer: {type(exc).__name__}"] += 1
        assert sum(len(p) for _, p in pieces) <= cap
        return
    assert sum(len(p) for _, p in pieces) <= cap
    rec = RawRequest(scheduled=0.0, sent=0.0, warm=False, prompt_tokens=1, prompt_source="words", max_tokens=4,
                     pieces=list(pieces), eof=1.0)
    replay(rec)
    TALLY[f"answer: {'error ' + str(rec.error) if rec.error else 'complete'}"] += 1
