from __future__ import annotations

import hashlib
import re
import secrets

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

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
    # Trusted venues (a machine of one's own, a datacenter pod one operates) may validate
    # the work of others; an edge swarm's workers are nobody's word.
    trusted = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return venue_queue(self.name)


def venue_defaults(name: str, kind: str | None = None) -> dict[str, object]:
    """How a venue first named by a command starts: its kind from its name where that is a
    kind, and trusted only when local (this machine is one's own)."""
    kind = kind or (name if name in Venue.Kind.values else Venue.Kind.LOCAL)
    return {"kind": kind, "trusted": kind == Venue.Kind.LOCAL}


def venue_queue(name: str) -> str:
    return f"venue.{name}"


def worker_queue(worker_id: str) -> str:
    return f"worker.{worker_id}"


def new_worker_id() -> str:
    return "w" + secrets.token_hex(6)


WORKER_ID = re.compile(r"w[0-9a-f]{12}")  # what new_worker_id makes


def token_digest(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


class EnrolmentToken(models.Model):
    """Lets workers join one venue. Only its sha256 is kept: the plaintext is shown once,
    when it is made."""

    venue = models.ForeignKey(Venue, on_delete=models.CASCADE, related_name="tokens")
    digest = models.CharField(max_length=64, unique=True)
    label = models.CharField(max_length=100, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    expires = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"token {self.digest[:8]} for {self.venue}"


class Worker(models.Model):
    """A registered worker: who it is (its ed25519 public key), what it serves, what it
    costs, and whether it is still with us. Its live state (load, heartbeats) is in Redis;
    this row is its identity and its last word."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        LOST = "lost"
        DEREGISTERED = "deregistered"

    id = models.CharField(primary_key=True, max_length=16, default=new_worker_id, editable=False)
    name = models.CharField(max_length=64)
    venue = models.ForeignKey(Venue, on_delete=models.CASCADE, related_name="workers")
    token = models.ForeignKey(
        EnrolmentToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="workers"
    )
    models_served = models.JSONField(default=list)  # model names; [] serves any
    concurrency = models.PositiveIntegerField(default=1)
    context_tokens = models.PositiveIntegerField(default=128_000)
    # Dollars per 1,000 tokens, exact (frlm_web.money).
    price_in = models.DecimalField(max_digits=20, decimal_places=12, default=0)
    price_out = models.DecimalField(max_digits=20, decimal_places=12, default=0)
    public_key = models.CharField(max_length=44)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    registered = models.DateTimeField(auto_now_add=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    health = models.JSONField(default=dict)  # the last heartbeat's figures
    deregistered = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["venue", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["venue", "name"],
                condition=~Q(status="deregistered"),
                name="one_registered_worker_name_per_venue",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id}) on {self.venue}"

    @property
    def queue(self) -> str:
        return worker_queue(self.id)
