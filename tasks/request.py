"""A stage's request: one frozen dataclass whose fields are the stage's options, declared once.

The CLI builds its options from the fields (`add_options`): name, default, type and help cannot
drift from what the flow takes, since a flow's keyword parameters are the same fields. A request's
`check()` validates everything and resolves what later steps need (the model's store group, the
default layer set, the head's directory) once; the flow and its tasks receive the resolved
request instead of checking again.

The CLI checks before Prefect starts, so bad input fails in one line without a flow run; it
hands the checked request to the flow through `handed_over`, which the flow's own check takes
instead of repeating it (a deployment's run, which has no CLI in front, checks in the flow).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from store.errors import LayerwaveError

_TYPES = {"int": int, "float": float, "str": str}


def option(default: Any = None, help: str = "", *, flag: str | None = None, cli: bool = True,
           **argparse_options) -> Any:
    """A request field and its command-line option: `--<field-name>` unless `flag` names it
    otherwise; `cli=False` for a field the command line does not offer; `cli_default=None` for an
    option whose default the command decides (left out, the field keeps its own)."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "cli": cli, **argparse_options})


def add_options(parser: argparse.ArgumentParser, request_type: type) -> None:
    """`--name` options for every field of `request_type`, with its default, type and help (an option
    the parser already has, from another request of the same command, is kept as it is)."""
    for spec in dataclasses.fields(request_type):
        meta = dict(spec.metadata)
        flag = meta.pop("flag") or "--" + spec.name.replace("_", "-")
        if not meta.pop("cli", True) or flag in parser._option_string_actions:
            continue
        meta["default"] = meta.pop("cli_default", spec.default)
        if meta["default"] is not None and meta["default"] is not False and "default" not in meta["help"]:
            meta["help"] += " (default: %(default)s)"
        kind = str(spec.type).removesuffix(" | None")
        if kind == "bool":
            meta.setdefault("action", "store_true" if spec.default is False else argparse.BooleanOptionalAction)
        else:
            meta.setdefault("type", _TYPES.get(kind, str))
            meta.setdefault("metavar", flag.lstrip("-").upper().replace("-", "_"))
        if "type" in meta:
            meta["type"] = one_line(meta["type"])
        parser.add_argument(flag, dest=spec.name, **meta)


def one_line(parse):
    """A parser of option text whose LayerwaveError argparse reports as its own one-line refusal."""
    def parse_option(text: str):
        try:
            return parse(text)
        except LayerwaveError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    parse_option.__name__ = parse.__name__
    return parse_option


def from_args(request_type: type, args: argparse.Namespace):
    """The request a command line asked for; an option left out (None) keeps the field's default."""
    return request_type(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(request_type)
                           if getattr(args, spec.name, None) is not None})


def parameters(request) -> dict:
    """The request as the flow's keyword parameters."""
    return {spec.name: getattr(request, spec.name) for spec in dataclasses.fields(request)}


_handed_over: list = []  # at most one (request, its check) pair


def check_ahead(request):
    """Check now (the CLI, before Prefect starts) and keep the result for the flow started next."""
    _handed_over[:] = [(request, request.check())]
    return _handed_over[0][1]


def checked(request):
    """`request.check()`, unless the CLI just checked this very request: then that result."""
    if _handed_over and _handed_over[0][0] == request:
        return _handed_over.pop()[1]
    return request.check()
