#!/usr/bin/env python
"""Django's command-line utility for FRLM web."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "frlm_web.settings")
    from frlm_web.light import run_light

    if run_light(sys.argv):  # a command that needs no app registry (frlm_web/light.py)
        return
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
