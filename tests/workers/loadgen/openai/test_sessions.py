"""Sessions (issue 41 point 3, ``--sessions``) against the scripted fake server (tests/fake_openai.py, which logs every
request's messages or prompt): each session's turns in order, each with the history (the earlier prompts and the
server's actual answers) as chat messages or one completions text, the think time between an answer and the next
turn, salts that leave a session's own history shared and different sessions sharing nothing, ShareGPT conversations
replayed whole, and the per-turn figures (TTFT, the prefix-cache share) in the row."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from farm.errors import RequestError
from schemas.llm import LlmSettings
from tests.fake_openai import fake_server, read_log
from tests.workers.loadgen.openai.test_openai_client import _measure, stored
from workers.loadgen.openai.load_loop import request_seq
from workers.loadgen.openai.sessions import TURN_GAP, sharegpt_sessions, split_sessions, synthetic_sessions
from workers.loadgen.openai.workload import SALT_WORDS

THINK_MS = 150.0
ANSWER = " t0 t1 t2 t3"  # the fake server's answer of 4 tokens


def _logged(log: Path) -> list[dict[str, Any]]:
    """The fake server's entries of complete requests, in send order."""
    return sorted((e for e in read_log(log) if e["done"]), key=lambda e: request_seq(e["rid"]))


def _by_session(entries: list[dict[str, Any]], first: Any) -> dict[str, list[dict[str, Any]]]:
    """The entries grouped by their session: the text of their first turn (``first``: how to read it)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        out.setdefault(first(e["asked"]), []).append(e)
    return out


def test_chat_turns_carry_their_history_in_order_after_the_think_time(tmp_path: Path) -> None:
    """3-turn sessions, 2 in flight: turn k holds the k-1 earlier prompts and the server's answers in order, then its
    own; it reaches the server at least the think time after the last token of turn k-1's answer left it."""
    log = tmp_path / "server.log"
    with fake_server(log=log, ttft_ms=5, itl_ms=1, cache=True, log_prompts=True) as url:
        r = _measure(url, concurrency=2, sessions=3, think_ms=THINK_MS, input_tokens=12, output_tokens=4)
    assert r.metrics["error_count"] == 0
    sessions = _by_session(_logged(log), lambda asked: asked[0]["content"])
    assert len(sessions) >= 2
    whole = [s for s in sessions.values() if len(s) == 3]
    assert whole, "no session ran its 3 turns"
    for turns in sessions.values():
        for k, e in enumerate(turns, 1):
            asked = e["asked"]
            assert [m["role"] for m in asked] == ["user", "assistant"] * (k - 1) + ["user"]
            assert all(m["content"] == ANSWER for m in asked[1::2])  # the server's actual answers
            if k > 1:
                before = turns[k - 2]
                assert asked[:-2] == before["asked"] and asked[-2]["content"] == ANSWER  # its history, in order
                assert e["recv"] - before["tokens"][-1] >= THINK_MS / 1e3 - 0.002
    # every session's first turn is salted apart: the first words differ (no prefix shared between sessions)
    heads = [" ".join(first.split()[:SALT_WORDS]) for first in sessions]
    assert len(set(heads)) == len(heads)
    m = r.metrics
    assert m["turn1_ttft_p50_ms"] is not None and m["turn3_ttft_p50_ms"] is not None
    assert "turn4_ttft_p50_ms" not in m
    # the fake's prefix cache (4-word blocks): a session's turn 1 shares nothing, its later turns their history
    assert m["turn1_cached_prompt_tokens_pct"] == 0
    assert 0 < m["turn2_cached_prompt_tokens_pct"] < m["turn3_cached_prompt_tokens_pct"]
    turns = r.details["session_turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and all(t["requests"] >= 1 for t in turns)
    assert turns[0]["prompt_tokens_mean"] < turns[1]["prompt_tokens_mean"] < turns[2]["prompt_tokens_mean"]
    assert r.details["workload"]["sessions"] == 3 and r.details["workload"]["think_ms"] == THINK_MS
    assert not any("prefix cache" in n for n in r.details["notes"])  # shared by design: no note


def test_completions_turns_are_one_text_the_history_first(tmp_path: Path) -> None:
    """openai-completions: turn k's prompt is turn k-1's prompt, its answer and the turn gap, then its own text."""
    log = tmp_path / "server.log"
    with fake_server(log=log, ttft_ms=5, itl_ms=1, log_prompts=True) as url:
        r = _measure(url, concurrency=1, sessions=2, input_tokens=8, output_tokens=4, api="openai-completions")
    assert r.metrics["error_count"] == 0
    entries = _logged(log)
    firsts = entries[0::2]
    for a, b in zip(entries[0::2], entries[1::2], strict=False):
        assert b["asked"].startswith(a["asked"] + ANSWER + TURN_GAP)
        assert len(b["asked"].split()) == len(a["asked"].split()) + 4 + 8
    assert len({" ".join(e["asked"].split()[:SALT_WORDS]) for e in firsts}) == len(firsts)


def _sharegpt(path: Path, conversations: list[list[tuple[str, str]]]) -> Path:
    path.write_text(json.dumps([{"id": str(i), "conversations": [{"from": who, "value": text} for who, text in conv]}
                                for i, conv in enumerate(conversations)]))
    return path


CONVERSATIONS = [
    [("human", "what is a cat"), ("gpt", "a small animal that purrs"), ("human", "and a dog"),
     ("gpt", "a loyal animal"), ("human", "which one is better"), ("gpt", "both are fine")],
    [("human", "hello"), ("gpt", "hi there friend"), ("human", "bye"), ("gpt", "see you")],
    [("human", "one turn only"), ("gpt", "so it is not a session")],
]


def test_sharegpt_conversations_are_replayed_whole(tmp_path: Path, sqlite_url: str) -> None:
    """--sessions sharegpt: the multi-turn conversations' human turns in order (the single-turn one left out), each
    asking for as many tokens as the recorded answer after it holds; the history holds the server's answers."""
    path = _sharegpt(tmp_path / "chats.json", CONVERSATIONS)
    llm = LlmSettings(sessions="sharegpt", prompts=str(path))
    built = split_sessions(tuple(sharegpt_sessions(llm, path, None)))
    assert [[p.text for p in s] for s in built] == [["what is a cat", "and a dog", "which one is better"],
                                                    ["hello", "bye"]]
    assert [[p.max_tokens for p in s] for s in built] == [[5, 3, 3], [3, 2]]
    log = tmp_path / "server.log"
    with fake_server(log=log, ttft_ms=5, itl_ms=1, log_prompts=True) as url:
        r = _measure(url, concurrency=1, sessions="sharegpt", prompts=stored("prompts", path))
    assert r.metrics["error_count"] == 0
    entries = _logged(log)
    asked = [[m["content"] for m in e["asked"][0::2]] for e in entries[:5]]
    assert [a[-1] for a in asked[1:3]] == ["and a dog", "which one is better"] and asked[4][-1] == "bye"
    for k in (0, 3):  # a session's first turn: its salt's words in front
        assert asked[k][0].split(maxsplit=SALT_WORDS)[-1] == ["what is a cat", "hello"][k // 3]
    assert asked[2][0] == asked[0][0] and asked[2][1] == "and a dog"  # the history as it was sent
    assert [e["n"] for e in entries[:5]] == [5, 3, 3, 3, 2]
    assert [m["content"] for m in entries[2]["asked"][1::2]] == [" t0 t1 t2 t3 t4", " t0 t1 t2"]


def test_synthetic_sessions_are_salted_once_each() -> None:
    """Turn 1 of each synthetic session holds the salt, the later turns none (their history is the session's)."""
    prompts = synthetic_sessions(LlmSettings(sessions=4, input_tokens=10, output_tokens=3), None, 32)
    sessions = split_sessions(tuple(prompts))
    assert len(sessions) == 8 and all([p.turn for p in s] == [1, 2, 3, 4] for s in sessions)
    assert all(s[0].salt_at is not None and all(p.salt_at is None for p in s[1:]) for s in sessions)
    assert all(p.input_tokens == 10 and p.max_tokens == 3 for s in sessions for p in s)
    shared = synthetic_sessions(LlmSettings(sessions=2, input_tokens=10, prefix_tokens=6), None, 8)
    firsts = [p for p in shared if p.turn == 1]
    assert len({p.text[:p.salt_at] for p in firsts}) == 1 and all(len(p.text[:p.salt_at].split()) == 6 for p in firsts)
    assert all(p.input_tokens == 16 for p in firsts)  # the prefix's tokens and the turn's own


def test_bad_sessions_input_is_refused(tmp_path: Path) -> None:
    path = _sharegpt(tmp_path / "single.json", CONVERSATIONS[2:])
    with pytest.raises(RequestError, match="holds no multi-turn conversation"):
        sharegpt_sessions(LlmSettings(sessions="sharegpt", prompts=str(path)), path, None)
    for bad, text in (({"sessions": 0}, "1 to 1000 turns"), ({"sessions": "3", "think_ms": -1}, "greater than"),
                      ({"think_ms": 5}, "add --sessions"), ({"sessions": "sharegpt"}, "give --prompts"),
                      ({"sessions": 2, "prompts": "x.json"}, "give --sessions sharegpt"),
                      ({"sessions": "many"}, "not a number of turns")):
        with pytest.raises(ValueError, match=text):
            LlmSettings(**bad)
