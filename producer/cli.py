"""`sandfarm`: a thin shell over library calls."""

from __future__ import annotations

import click

from producer.commands import batch, farm, jobs, local


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sandfarm")
def main() -> None:
    """sandfarm: run untrusted, agent-generated code in bounded sandboxes, at scale."""


local.register(main)
farm.register(main)
jobs.register(main)
batch.register(main)


if __name__ == "__main__":
    main()
