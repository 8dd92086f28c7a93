from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

venue_name_validator = RegexValidator(
    r"^[a-z][a-z0-9_-]{0,31}$",
    "A venue name is 1 to 32 lowercase letters, digits, '-' or '_', starting with a letter.",
)


class Venue(models.Model):
    """A place sub-queries run: a machine, an edge swarm, a datacenter pod.
    Its workers consume the Celery queue `venue.<name>`."""

    class Kind(models.TextChoices):
        LOCAL = "local", "local"
        EDGE = "edge", "edge swarm"
        DATACENTER = "datacenter", "datacenter pod"

    name = models.CharField(max_length=32, unique=True, validators=[venue_name_validator])
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.LOCAL)
    description = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return venue_queue(self.name)


def venue_queue(name: str) -> str:
    return f"venue.{name}"
