"""The LLM engines' knobs: the server settings farm sweeps as matrix dimensions (``--knob NAME=V1,V2``), named
per engine on its card (``schemas.engines.CARDS``) and checked here, before any job runs. A job carries its values
in ``JobSpec.knobs``; each engine's serving module (``workers/serving/``) turns them into its server's flags. A
knob left out keeps the engine's default, except ``n_threads``, which follows the job's core lease."""
from __future__ import annotations

from collections.abc import Mapping

from schemas.engines import CARDS
from schemas.knobs import Knob, KnobValue

#: each engine's knobs by name, in card order (engines without knobs left out): derived from the cards
KNOBS: dict[str, dict[str, Knob]] = {c.name: {k.name: k for k in c.knobs} for c in CARDS.values() if c.knobs}


def knob_help() -> str:
    """Every engine's knobs, one line each (for ``--knob``'s help and errors)."""
    return "; ".join(f"{engine}: {', '.join(k.describe() for k in knobs.values())}" for engine, knobs in KNOBS.items())


def check_knobs(engine: str, knobs: Mapping[str, object]) -> dict[str, KnobValue]:
    """``knobs`` checked for ``engine``, each value of its knob's type; ValueError naming an unknown knob (and
    the engine's own) or a bad value."""
    if not knobs:
        return {}
    own = KNOBS.get(engine)
    if own is None:
        raise ValueError(f"engine {engine} has no knobs (knobs are settings of the LLM engines: {', '.join(KNOBS)}); "
                         f"drop {', '.join(sorted(knobs))}")
    unknown = sorted(set(knobs) - set(own))
    if unknown:
        raise ValueError(f"engine {engine} has no knob {', '.join(unknown)}; its knobs: "
                         f"{', '.join(k.describe() for k in own.values())}")
    return {name: own[name].check(value) for name, value in knobs.items()}


def typed_knob(name: str, value: object) -> KnobValue:
    """``value`` as knob ``name``'s type (the first engine's knob of that name; ``n_threads`` is shared)."""
    for own in KNOBS.values():
        if name in own:
            return own[name].check(value)
    raise ValueError(f"no LLM engine has a knob {name}; the knobs: {knob_help()}")
