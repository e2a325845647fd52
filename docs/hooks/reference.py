"""MkDocs hook: generated pages, never written by hand.

``reference/cli.md`` and ``reference/config.md`` are committed (so their links work in a
checkout), written by ``python docs/hooks/reference.py``; the build fails when either differs
from what qhlab's parser and models give now. ``reference/cli.md`` is every command's
``--help``, read from qhlab's own argparse parser;
``reference/config.md`` lists every field of the study, tuning, pilot, plan and E0 check configs
and of the recipe (and of each model nested in them): type, default, allowed values (from the pydantic JSON schema) and the
meaning the model's docstring gives it. A field without a documented meaning fails the build.
``performance.md``'s ``<!-- benchmarks -->`` becomes the table of ``docs/benchmarks.jsonl``, the
JSON lines the benches printed (``scripts/record-bench``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import typing

from mkdocs.structure.files import Files
from pydantic import BaseModel

_NO_DEFAULT = "required"
_BENCHMARKS = "benchmarks.jsonl"
_MARKER = "<!-- benchmarks -->"
# The figures a row shows: ratios, fractions and shares, and the checks that are yes or no.
_FIGURE_SUFFIXES = ("ratio", "fraction", "share", "share_of_step", "share_of_load")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != "performance.md":
        return markdown
    if markdown.count(_MARKER) != 1:
        raise ValueError(f"performance.md: {_MARKER} appears {markdown.count(_MARKER)} times; allowed: once")
    return markdown.replace(_MARKER, _benchmarks_table(os.path.join(config["docs_dir"], _BENCHMARKS)))


def _benchmarks_table(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    lines = ["| command | figures | targets | host (load before, after) | commit, date |", "|---|---|---|---|---|"]
    for r in records:
        out = r["output"]
        figures = ", ".join(f"`{k}` {v}" for k, v in sorted(out.items())
                            if not k.startswith("target") and (k.endswith(_FIGURE_SUFFIXES) or k.startswith(("identical", "meets"))))
        targets = ", ".join(f"`{k}` {v}" for k, v in sorted(out.items()) if k.startswith("target"))
        host = f"{r['host']['cpu']}, {r['host']['cores']} cores ({r['host']['load_before']}, {r['host']['load_after']})"
        lines.append(f"| `{r['command']}` | {_cell(figures)} | {_cell(targets)} | {_cell(host)} | "
                     f"{r['commit']}, {r['date']} |")
    lines += ["", "Each run's whole JSON line:", ""]
    for r in records:
        lines += [f"`{r['command']}`", "", "```json", json.dumps(r["output"], sort_keys=True), "```", ""]
    return "\n".join(lines)


def _pages() -> dict[str, str]:
    """{page under docs/: its generated text}."""
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal width: fix it
    return {"reference/cli.md": _cli_page(), "reference/config.md": _config_page()}


def on_files(files: Files, config) -> Files:
    for page, content in _pages().items():
        path = os.path.join(config["docs_dir"], page)
        with open(path, encoding="utf-8") as handle:
            if handle.read() != content:
                raise ValueError(f"docs/{page} is stale: regenerate it with `python docs/hooks/reference.py`")
    return files


# ------------------------------------------------------------------------------ CLI


def _cli_page() -> str:
    from qhlab.cli import build_parser

    parser = build_parser()
    lines = ["# Command line reference", "",
             "Every command's `--help`, generated from qhlab's own parser when these pages are built.",
             "Exit codes are in [exit codes](exit-codes.md).", ""]
    for path, sub in _commands(parser, ["qhlab"]):
        lines += [f"## `{' '.join(path)}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def _commands(parser: argparse.ArgumentParser, path: list[str]):
    yield path, parser
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, [*path, name])


# --------------------------------------------------------------------------- config


def _config_page() -> str:
    from qhlab.design.e0_config import QhE0CheckConfig
    from qhlab.design.pilot_config import QhPilotConfig
    from qhlab.design.plan_config import QhPlanConfig
    from qhlab.design.tuning_config import QhTuningConfig
    from qhlab.finite_horizon.recipe import QhRecipe
    from qhlab.finite_horizon.studies.architecture_study import QhArchitectureStudyConfig

    lines = ["# Config reference", "",
             "Every field of a study config (`qhlab study ... CONFIG`), a tuning config (`qhlab tune CONFIG`), "
             "a pilot config (`qhlab pilot CONFIG`), a plan config (`qhlab plan CONFIG`), an E0 check config (`qhlab e0-check CONFIG`) and a recipe "
             "(`qhlab fit RECIPE`),",
             "generated from their pydantic models when these pages are built. Unknown fields are refused.", ""]
    for title, model in (("Study config", QhArchitectureStudyConfig), ("Tuning config", QhTuningConfig),
                         ("Pilot config", QhPilotConfig), ("Plan config", QhPlanConfig),
                         ("E0 check config", QhE0CheckConfig),
                         ("Recipe", QhRecipe)):
        lines += [f"## {title}", ""]
        for cls in _models(model):
            lines += _model_table(cls, top=cls is model)
    return "\n".join(lines)


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """``root`` and every model nested in its fields, each once, in field order."""
    seen: list[type[BaseModel]] = []

    def visit(cls: type[BaseModel]) -> None:
        if cls in seen:
            return
        seen.append(cls)
        for field in cls.model_fields.values():
            for inner in _nested(field.annotation):
                visit(inner)

    visit(root)
    return seen


def _nested(annotation) -> list[type[BaseModel]]:
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested(arg)]


def _attribute_docs(cls: type[BaseModel]) -> dict[str, str]:
    """Field name -> its text in the class docstring's ``Attributes:`` section (one line)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    section = re.search(r"^Attributes:\n(.*?)(?:\n\S|\Z)", doc, re.S | re.M)
    if section is None:
        return {}
    found: dict[str, str] = {}
    for match in re.finditer(r"^    (\w+(?:, \w+)*):(.*?)(?=^    \w+(?:, \w+)*:|\Z)", section.group(1), re.S | re.M):
        for name in match.group(1).split(", "):
            found[name] = " ".join(match.group(2).split())
    return found


def _model_table(cls: type[BaseModel], *, top: bool) -> list[str]:
    schema = cls.model_json_schema()
    docs = _attribute_docs(cls)
    first = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    missing = [name for name in cls.model_fields if name not in docs]
    if missing:
        raise ValueError(f"config reference: {cls.__name__} fields {missing} have no line in its docstring's "
                         "Attributes section; allowed: every field documented")
    lines = [f"### `{cls.__name__}`" + ("" if top else " (nested)"), "", first, "",
             "| field | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    # The docstring's order, which reads as the config does; a base model's fields come first in
    # ``model_fields`` whatever their place in the config.
    for name in sorted(cls.model_fields, key=list(docs).index):
        field = cls.model_fields[name]
        prop = schema["properties"].get(field.alias or name, {})
        default = _NO_DEFAULT if field.is_required() else f"`{field.get_default(call_default_factory=True)!r}`"
        lines.append(f"| `{name}` | {_type(prop)} | {default} | {_allowed(prop)} | {_cell(docs[name])} |")
    return [*lines, ""]


def _type(prop: dict) -> str:
    if "$ref" in prop:
        return f"`{prop['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in prop:
        return " or ".join(_type(p) for p in prop["anyOf"])
    if prop.get("type") == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if "const" in prop:
        return f"`{prop['const']!r}`"
    return f"{prop.get('type', 'any')}"


def _allowed(prop: dict) -> str:
    if "anyOf" in prop:
        return "; ".join(a for a in (_allowed(p) for p in prop["anyOf"]) if a) or ""
    parts = []
    if "enum" in prop:
        parts.append(", ".join(f"`{v!r}`" for v in prop["enum"]))
    for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"),
                      ("minLength", "length >="), ("maxLength", "length <="), ("minItems", "items >="),
                      ("maxItems", "items <=")):
        if key in prop:
            parts.append(f"{sign} {prop[key]}")
    if "pattern" in prop:
        parts.append(f"matches `{prop['pattern']}`")
    return _cell(", ".join(parts))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


if __name__ == "__main__":
    _here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _page, _content in _pages().items():
        with open(os.path.join(_here, _page), "w", encoding="utf-8") as _handle:
            _handle.write(_content)
