"""`tracebench record`. Light at import time: aiohttp and the proxy are imported inside the command."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit

import click

from tracebench.errors import ConfigError
from tracebench.options import INT


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen {value!r}: expected HOST:PORT, e.g. 127.0.0.1:31000")
    return host, int(port)


def _upstream(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(f"--upstream {value!r}: expected a server address like http://127.0.0.1:30000")
    return value.rstrip("/")


@click.command("record")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="Where the proxy listens; point your clients here instead of at the server.  [required to "
                   "record; not with --recover]")
@click.option("--upstream", default=None, metavar="URL",
              help="The sglang server or router the traffic goes to, e.g. http://127.0.0.1:30000. It must answer "
                   "when the recording starts.  [required]")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=Path("traces/recorded.jsonl"),
              show_default=True,
              help="The trace to write (never overwritten). Next to it: NAME.status.jsonl, every request's status, "
                   "and while recording .NAME.part (one recording per name: a second one is refused).")
@click.option("--recover", is_flag=True, default=False,
              help="Instead of recording: turn the part file .NAME.part that a recording killed before it finished "
                   "(SIGKILL, a crash, a full disk) left beside -o NAME into the trace and the status file (requests "
                   "it had not finished: cancelled), then remove it.")
@click.option("--block-size", type=INT, default=64, show_default=True, metavar="B",
              help="Tokens per prefix block (the trace header's block_size).")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None, metavar="PATH",
              help="tokenizer.json (or its folder) of the served model, or 'wordlevel' (the word-level tokenizer of the "
                   "sim-server and the GPU setup, built in), to turn text prompts into token ids for the "
                   "prefix blocks. WordLevel tokenizers with a whitespace pre-tokenizer are read by tracebench; any "
                   "other needs the optional 'tokenizers' package (pip install 'tracebench[record]'). [default: "
                   "only requests that send token ids get prefix blocks; text prompts lose their prefix structure, which the "
                   "recorder warns about, with the count, when it stops]")
@click.option("--quiet", is_flag=True, default=False, help="Print nothing but errors and warnings.")
def record(listen: str | None, upstream: str | None, output: Path, recover: bool, block_size: int,
           tokenizer: Path | None, quiet: bool) -> None:
    """Record live traffic as a trace: a proxy in front of an sglang server or router.

    \b
    POST /generate, /v1/completions and /v1/chat/completions are forwarded unchanged (streamed or not, errors
    included) and recorded; every other path is passed through. Each recorded request becomes one trace line:
    arrival time (seconds after the first request), input and output length as the server counted them
    (meta_info.prompt_tokens/completion_tokens, or usage), and prefix blocks: ids of the prompt's blocks of B
    tokens, salted and chained (equal ids = equal prompt prefix; the salt is random per recording and never
    written, so the ids mean nothing outside this file). No prompt text, token id or answer is stored.
    Blocks come from input_ids / a prompt of ids as sent, else from text (chat: the messages' contents in order)
    tokenized with --tokenizer (--tokenizer wordlevel in front of a sim-server; the model's tokenizer.json in
    front of a real server): without it a text prompt gets no blocks, and the recorder says how many lost them. An
    OpenAI stream whose client did not ask for usage gets include_usage added, and
    the usage chunk is held back from the client. A batch of prompts or n > 1 is forwarded, not a trace line.
    docs/record.md says exactly what is kept.
    \b
    Ctrl-C (or SIGTERM) stops it: requests in flight are recorded as cancelled, the trace (ok requests, in
    arrival order, trace format v1) and NAME.status.jsonl (every request: ok / error / cancelled, HTTP status,
    error) are written atomically. Replay the trace with `tracebench replay` (--api to pick the API).
    Every request's arrival and end go to .NAME.part as they happen: a recording killed before it finished
    leaves that file, and a later recording to NAME is refused until `--recover -o NAME` turned it into the
    trace (or it is moved away). An upstream that breaks off an answer gets the client's connection broken
    off too, and the request recorded as error. Exit 2: bad input, including an -o that is taken or cannot be
    written and a --listen address that cannot be bound.
    \b
    tracebench record --listen 127.0.0.1:31000 --upstream http://127.0.0.1:30000 -o traces/prod.jsonl
    tracebench record --listen 0.0.0.0:8000 --upstream http://gpu1:30000 --tokenizer models/llama/tokenizer.json
    tracebench record --recover -o traces/prod.jsonl
    """
    if recover:
        given = [flag for flag, value in (("--listen", listen), ("--upstream", upstream), ("--tokenizer", tokenizer))
                 if value is not None]
        if given:
            verb = "does" if len(given) == 1 else "do"
            raise ConfigError(f"--recover writes the trace a stopped recording left: {', '.join(given)} {verb} not "
                              f"apply")
        from tracebench.record.part import recover as recover_part, status_path

        count, counts, lost, text_without_blocks = recover_part(output)
        if not quiet:
            click.echo(f"{output}: {count} request(s) recovered (ok {counts['ok']}, error {counts['error']}, cancelled "
                       f"{counts['cancelled']}, of which {lost} in flight when the recording stopped); every "
                       f"request's status: {status_path(output)}", err=True)
        _warn_lost_structure(text_without_blocks, count)
        click.echo(str(output))
        return
    for flag, value in (("--listen", listen), ("--upstream", upstream)):
        if value is None:
            raise ConfigError(f"{flag} is required (or --recover -o NAME, to turn a stopped recording's part file "
                              f"into its trace)")
    assert listen is not None and upstream is not None
    from tracebench.record.blocks import load_tokenizer
    from tracebench.record.proxy import RecordConfig, run_record

    host, port = _listen(listen)
    if block_size < 1:
        raise ConfigError(f"--block-size must be >= 1, got {block_size}")
    tokenize, desc = load_tokenizer(tokenizer) if tokenizer is not None else (None, None)
    cfg = RecordConfig(host=host, port=port, upstream=_upstream(upstream), output=output, block_size=block_size,
                       tokenizer=tokenize, tokenizer_desc=desc, quiet=quiet)
    count, trace, status, counts, text_without_blocks = run_record(cfg, sys.stderr)
    if not quiet:
        click.echo(f"{trace}: {count} request(s) (ok {counts['ok']}, error {counts['error']}, cancelled "
                   f"{counts['cancelled']}); every request's status: {status}", err=True)
    _warn_lost_structure(text_without_blocks, count)
    click.echo(str(trace))


def _warn_lost_structure(text_without_blocks: int, count: int) -> None:
    """Said even with --quiet: the trace cannot show the prefix cache's effect for these requests."""
    from tracebench.record.part import TOKENIZER_HINT

    if text_without_blocks:
        click.echo(f"tracebench record: warning: {text_without_blocks} of the trace's {count} requests lost their prefix "
                   f"structure (text prompts, no --tokenizer: no prefix_blocks, so their replay shares no prefix and "
                   f"hits no cache): {TOKENIZER_HINT}", err=True)
