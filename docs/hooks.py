"""MkDocs hooks: pages that render from the code, so they cannot drift from it.

``<!-- compass:settings -->`` becomes the table of every ``compass_*`` setting, from
``compass_celery.settings.OPTIONS``; ``<!-- compass:cli -->`` becomes the ``--help`` of
every ``compass-celery`` command, from the click group itself.
"""

from __future__ import annotations

import click


def _settings_table() -> str:
    from compass_celery.settings import OPTIONS

    rows = ["| setting | default | unit | meaning |", "| --- | --- | --- | --- |"]
    for name, opt in OPTIONS.items():
        doc = opt.doc.replace("|", "\\|")
        rows.append(f"| `compass_{name}` | `{opt.default!r}` | {opt.unit} | {doc} |")
    return "\n".join(rows)


def _cli_help() -> str:
    from compass_celery.cli import compass_command

    out: list[str] = []

    def walk(command: click.Command, ctx: click.Context, path: str) -> None:
        if path:
            out.append(f"### `compass-celery {path}`\n\n```text\n{command.get_help(ctx)}\n```\n")
        if isinstance(command, click.Group):
            for name in sorted(command.list_commands(ctx)):
                sub = command.get_command(ctx, name)
                if sub is None or sub.hidden:
                    continue
                with click.Context(sub, info_name=name, parent=ctx) as sub_ctx:
                    walk(sub, sub_ctx, f"{path} {name}".strip())

    with click.Context(compass_command, info_name="compass-celery") as group_ctx:
        walk(compass_command, group_ctx, "")
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: object) -> str:
    """Fill in the generated parts of a page."""
    if "<!-- compass:settings -->" in markdown:
        markdown = markdown.replace("<!-- compass:settings -->", _settings_table())
    if "<!-- compass:cli -->" in markdown:
        markdown = markdown.replace("<!-- compass:cli -->", _cli_help())
    return markdown
