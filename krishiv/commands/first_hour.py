"""The first hour's tools: ``krishiv broker`` (a local Kafka broker), ``krishiv init`` (a spec from a sample of a
topic), ``krishiv topic`` (list, describe, create) and ``krishiv produce`` (demo orders or your own JSON lines)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from rich.markup import escape

from krishiv.commands.common import console, counted, say
from krishiv_core.errors import ConfigError
from krishiv_core.spec import KrishivSpec


def cmd_broker(args: argparse.Namespace) -> int:
    from krishiv.broker import default_port, serve

    return serve(args.host, args.port or default_port(os.environ), say)


def cmd_produce(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from rich.progress import Progress

    from krishiv.preflight import check_broker
    from krishiv.produce import demo_orders, ensure_topic, file_events, produce

    if args.file is None and args.key is not None:
        raise ConfigError("--key", "keys the lines of --file; the demo orders are keyed by customer already")
    if args.late + args.malformed > args.records:
        raise ConfigError("--late, --malformed", f"{args.late} + {args.malformed} exceed --records {args.records}")
    lines = None
    if args.file is not None:
        try:
            lines = sys.stdin.readlines() if args.file == "-" else Path(args.file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("--file", f"cannot read {args.file}: {exc}") from None
        where = "standard input" if args.file == "-" else args.file
        if (
            args.key
            and all(e.key is None for e in file_events(lines, 1, args.key, where))
            and any(map(str.strip, lines))
        ):
            raise ConfigError(
                "--key",
                f"no line of {where} has {args.key} (a field, or a dotted path into objects such as van.id): nothing "
                "was sent; name a field the lines hold, or leave --key out to send them round the partitions",
            )
    check_broker(spec)  # one line naming the address, not librdkafka's retries
    pipeline = spec.pipeline(args.pipeline)
    settings = spec.kafka.client_settings()  # [kafka.properties]: security, secrets resolved
    partitions = ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions, settings=settings)
    extra = {}
    if args.rate:
        extra = {"start_ms": int(time.time() * 1000), "spacing_ms": max(1, int(1000 / args.rate)), "jitter_ms": 0}
    if lines is not None:
        events = file_events(lines, partitions, args.key, where)
    else:
        events = demo_orders(
            args.records, seed=args.seed, partitions=partitions, late=args.late, malformed=args.malformed, **extra
        )
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing to {pipeline.topic}", total=len(events))
        produce(
            spec.kafka.bootstrap_servers,
            pipeline.topic,
            events,
            rate=args.rate,
            on_progress=lambda n: progress.update(task, completed=n),
            settings=settings,
        )
    if lines is not None:
        keyed = f"keyed by {args.key}" if args.key else "without keys, round the partitions"
        unkeyed = sum(e.key is None for e in events) if args.key else 0
        if unkeyed:
            keyed += f"; {counted(unkeyed, 'line')} with no {args.key} sent without a key"
        console.print(f"produced {len(events)} lines of {where} to {pipeline.topic} ({keyed})")
        return 0
    console.print(
        f"produced {len(events)} events to {pipeline.topic} on {spec.kafka.bootstrap_servers} "
        f"({args.late} ten minutes behind in event time, {args.malformed} malformed, seed {args.seed})"
    )
    if args.late:
        console.print(
            "an event behind in time is counted late (and dropped) by a windowed pipeline only when a batch before "
            "its own already closed its window: `krishiv run --once` over all of them at once counts none"
        )
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    import os
    import tomllib

    from krishiv.init_spec import analyse, check_kind, not_objects, sample_file, sample_topic, spec_text, write_spec
    from krishiv_core.spec import KafkaSettings, parse_spec

    output = Path(args.output)
    write_spec(output, "", check_only=True)  # an existing file is refused before the sample is read
    bootstrap = args.bootstrap or os.environ.get("KRISHIV_KAFKA_BOOTSTRAP") or KafkaSettings.bootstrap_servers
    key = [k.strip() for k in args.key.split(",")] if args.key else []
    # --file: your own JSON lines, before they are on the broker
    sampled = sample_file(args.file, args.sample) if args.file else sample_topic(bootstrap, args.topic, {}, args.sample)
    source = sampled.described
    sample = analyse(sampled.values, sampled.keys, sampled.where)
    if args.kind == "upsert" and not key and sample.key_fields:
        key = sample.key_fields  # the Kafka key's fields (Debezium's key is the primary key)
    check_kind(sample, args.kind, key)
    text = spec_text(sample, args.topic, args.kind, bootstrap, key, source=source)
    parse_spec(tomllib.loads(text), env={})  # what init writes, the spec reader takes
    write_spec(output, text)
    console.print(f"wrote {output} from {escape(source)}; its fields:")
    if sample.not_objects:
        console.print(escape(not_objects(sample)))
    for line in text.split("[pipelines.fields]\n", 1)[1].splitlines():
        console.print(f"  {escape(line)}")
    console.print(f"correct what the sample could not know, then: krishiv --spec {output} check")
    return 0


def cmd_topic(args: argparse.Namespace, spec: KrishivSpec) -> int:
    import re

    from krishiv.topics import create_topic, describe_topic, topic_names

    if args.action == "list":
        reading = {t: p.name for p in spec.pipelines for t in p.topics}
        topics = topic_names(spec)
        for name, partitions in topics.items():
            pipeline = f"  (read by {reading[name]})" if name in reading else ""
            console.print(f"{escape(name)}  {counted(partitions, 'partition')}{escape(pipeline)}")
        if not topics:
            console.print(
                f"no topics on {escape(spec.kafka.bootstrap_servers)} yet: "
                "krishiv topic create NAME, or krishiv produce"
            )
        return 0
    if not args.name:
        raise ConfigError("topic", f"krishiv topic {args.action} needs the topic's name")
    if args.action == "create":
        if not re.match(r"^[A-Za-z0-9._-]{1,249}$", args.name):
            raise ConfigError("topic", f"not a valid Kafka topic name: {args.name!r}")
        count, created = create_topic(spec, args.name, args.partitions or spec.kafka.partitions)
        said = "created" if created else "exists already, with"
        console.print(f"topic {escape(args.name)} {said} {counted(count, 'partition')}")
        return 0
    view = describe_topic(spec, args.name)
    readers = ", ".join(view.read_by) or "no pipeline of this spec"
    console.print(f"topic {escape(view.name)} (id {view.topic_id or 'unknown'}), read by {escape(readers)}")
    for p in view.partitions:
        offsets = counted(p.records, "offset")
        console.print(f"  partition {p.partition}: offsets {p.earliest} to {p.latest} ({offsets})")
    return 0
