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

    out = []
    with click.Context(compass_command, info_name="compass-celery") as group_ctx:
        for name in sorted(compass_command.list_commands(group_ctx)):
            command = compass_command.get_command(group_ctx, name)
            with click.Context(command, info_name=name, parent=group_ctx) as ctx:
                text = command.get_help(ctx)
            out.append(f"### `compass-celery {name}`\n\n```text\n{text}\n```\n")
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: object) -> str:
    """Fill in the generated parts of a page."""
    if "<!-- compass:settings -->" in markdown:
        markdown = markdown.replace("<!-- compass:settings -->", _settings_table())
    if "<!-- compass:cli -->" in markdown:
        markdown = markdown.replace("<!-- compass:cli -->", _cli_help())
    return markdown
