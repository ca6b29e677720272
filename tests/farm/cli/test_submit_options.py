"""``farm submit``'s options against the request model (``farm.cli.submit_options``): every option names a field
of ``ProfileRequest`` and its value lands there (name), leaves the model's default alone (default) and shows
that default in its help where the help states one (help)."""
from __future__ import annotations

import re
from typing import Any

import pytest
import typer.main

from farm.cli.main import app
from farm.cli.submit_options import SUBMIT_OPTIONS, Opt, field_default, help_text, model_field, request_data, shown
from schemas import ProfileRequest

OPTS = {o.name: o for o in SUBMIT_OPTIONS}
MAPPED = [o for o in SUBMIT_OPTIONS if o.field is not None]
#: per option: the value given on the command line and the value its field then holds
EXAMPLES: dict[str, tuple[Any, Any]] = {
    "model": ("m.onnx", "m.onnx"), "engine": (["openvino"], ["openvino"]), "device": (["gpu"], ["gpu"]),
    "batch_sizes": ("1,8", [1, 8]), "concurrency": ("2,4", [2, 4]), "name": ("nightly", "nightly"),
    "edge": (["cpus=1,memory=512m"], "cpus=1.0"), "input_spec": (["x:FP32:3"], "x"), "model_format": ("onnx", "onnx"),
    "duration": (5.0, 5.0), "windows": (7, 7), "window": (2.0, 2.0), "warmup": (1.5, 1.5), "stability": (5.0, 5.0),
    "stability_latency": ("p99", "p99"), "rate": ("5,10", [5.0, 10.0]), "mode": ("closed", "closed"),
    "rpc": ("stream", "stream"), "threads": ("2", 2), "instances": ("3", 3), "queue_delay": ("500", 500),
    "preferred_batch": (4, 4), "search": ("quick", "quick"), "p99": (50.0, 50.0), "client": ("farm", "farm"),
    "timeout": (30.0, 30.0), "op_profile": (True, True), "repeats": (3, 3), "input_data": ("zeros", "zeros"),
    "endpoint": ("localhost:8001", "localhost:8001"), "served_name": ("m", "m"), "knob": (["n_threads=2"], None),
    "api": ("openai-completions", "openai-completions"), "credential": ("lab", "lab"),
    "input_tokens": ("64", "64"), "output_tokens": ("32:64", "32:64"), "prefix_tokens": (16, 16), "seed": (3, 3),
    "slo": ("ttft=200", 200.0), "requests": (100, 100), "warmup_requests": (5, 5),
    "trace_speed": (2.0, 2.0), "trace_tokens": (0.5, 0.5), "trace_limit": (10, 10),
    "sessions": ("3", 3), "think_ms": (250.0, 250.0),
}
#: options whose example needs a file of its own or a matching engine (checked elsewhere: test_llm_submit,
#: test_workload_files, test_trace_submit)
ROUTED_ELSEWHERE = {"knob", "prompts", "tokenizer", "trace"}
#: the other options an example needs to make a valid request
NEEDS: dict[str, dict[str, Any]] = {"p99": {"search": "quick"}, "think_ms": {"sessions": "2"}}


def _submit_params() -> dict[str, Any]:
    cmd = typer.main.get_command(app).commands["submit"]  # type: ignore[attr-defined]
    return {p.name: p for p in cmd.params}


def test_submit_takes_exactly_the_declared_options() -> None:
    params = _submit_params()
    assert set(params) == set(OPTS)
    for name, p in params.items():
        o = OPTS[name]
        if o.flags:
            assert p.opts == list(o.flags), name
        assert p.help == help_text(o), name
        assert p.default == o.default, name


@pytest.mark.parametrize("opt", MAPPED, ids=lambda o: o.name)
def test_every_option_names_a_field_of_the_request(opt: Opt) -> None:
    assert opt.field is not None
    model, leaf = model_field(opt.field)
    assert leaf in model.model_fields


def test_a_renamed_field_is_caught() -> None:
    with pytest.raises(KeyError, match="max_window"):
        model_field("measurement.max_window")


@pytest.mark.parametrize("opt", MAPPED, ids=lambda o: o.name)
def test_an_option_left_out_leaves_the_model_default(opt: Opt) -> None:
    """An option not given passes nothing (None, or False for a flag): the request file's value or the model's
    default applies, never one of the CLI's own."""
    assert opt.default in (None, False)
    if opt.default is False:
        assert opt.field is not None and field_default(opt.field) is False


@pytest.mark.parametrize("opt", [o for o in MAPPED if "default" in o.help], ids=lambda o: o.name)
def test_a_default_in_the_help_is_the_model_s(opt: Opt) -> None:
    assert opt.field is not None
    model, leaf = model_field(opt.field)
    value, text = field_default(opt.field), help_text(opt)
    if value is None:  # nothing by default: said in words, or the choice the field's description marks so
        marked = re.search(r"(\S+) \(default\)", text)
        assert "(default: " in text or (marked and f"{marked.group(1)} (default)" in
                                        (model.model_fields[leaf].description or "")), text
        return
    said = shown(value)
    assert re.search(rf"(default {re.escape(said)}\b|\b{re.escape(said)} \(default\b)", text), (said, text)


def _request(opt: Opt, value: Any) -> ProfileRequest:
    opts: dict[str, Any] = {o.name: o.default for o in SUBMIT_OPTIONS}
    if opt.group == "llm" or opt.name in ("endpoint", "served_name"):
        opts.update(endpoint="http://localhost:8000", served_name="m", api="openai-chat")
    else:
        opts["model"] = "m.onnx"
    opts.update(NEEDS.get(opt.name, {}))
    opts[opt.name] = value
    return ProfileRequest.model_validate(request_data(opts))


def _at(request: ProfileRequest, path: str) -> Any:
    value: Any = request
    for part in path.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("opt", [o for o in MAPPED if o.name not in ROUTED_ELSEWHERE], ids=lambda o: o.name)
def test_an_option_s_value_lands_in_its_field(opt: Opt) -> None:
    given, expected = EXAMPLES[opt.name]
    assert opt.field is not None
    got = _at(_request(opt, given), opt.field)
    if opt.name in ("threads", "instances", "queue_delay"):  # a list of serving settings: the request's list
        got = _at(_request(opt, given), opt.key)
        expected = [expected]
    if opt.name == "rate":
        got = _at(_request(opt, given), "rates")
    shown_got = {"edge": lambda g: f"cpus={g[0].cpus}", "input_spec": lambda g: g[0].name,
                 "slo": lambda g: g.ttft_ms, "input_tokens": shown, "output_tokens": shown,
                 "input_data": lambda g: g.kind}.get(opt.name, lambda g: g)(got)
    assert shown_got == expected


def test_every_option_has_an_example() -> None:
    assert {o.name for o in MAPPED} - ROUTED_ELSEWHERE <= set(EXAMPLES)
