"""The OpenAPI 3 description of the worker registration API, written by hand so it says
what a worker author needs: every endpoint, body, header and error, and how to sign."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from workers.services import MAX_CONCURRENCY, MAX_CONTEXT_TOKENS, MAX_MODELS, MAX_PRICE

WORKER_ID = {"type": "string", "pattern": "^w[0-9a-f]{12}$", "example": "w3f9a0c1b2d4e"}

SIGNING = (
    "Heartbeat and deregister are signed with the worker's ed25519 key (the one whose public "
    "half it registered). The signature covers the canonical JSON (keys sorted, no spaces, "
    "UTF-8) of `{method, path, timestamp, body_sha256}`: the HTTP method in capitals, the "
    "URL path (e.g. `/api/workers/w3f9a0c1b2d4e/heartbeat`), the `X-FRLM-Timestamp` header "
    "exactly as sent (epoch seconds), and the hex sha256 of the request body's bytes. Send "
    "the signature in `X-FRLM-Signature` as the standard base64 of its 64 bytes (padded, "
    "`+/` alphabet, as `base64.b64encode` writes it; any other spelling is refused). A "
    "timestamp further than the replay window from the server's clock, or a signature sent "
    "a second time, is refused (401)."
)

THROTTLE = (
    "A request that fails to authenticate (401: no or a bad token, signature or challenge "
    "answer) counts against its source address, not against the worker it names: after "
    "FRLM_API_FAIL_LIMIT (20) failures in FRLM_API_FAIL_WINDOW_S (60 s), that address is "
    "answered 429 with a `Retry-After` header until the window ends, without its "
    "credentials being checked."
)

TAKE_BACK = (
    "A name held by a live (active or lost) registration can be taken back only with the "
    "same key, and only by proving to hold it: the first attempt answers 409 with a "
    "`challenge` (single use, valid FRLM_API_CHALLENGE_TTL_S, 60 s, for this venue, name "
    "and key); send the same registration again with `challenge` and `challenge_sig`, the "
    "base64 signature by the worker's key of the canonical JSON of `{challenge, name, "
    "public_key, venue}`. The previous registration is then retired and the worker gets a "
    "new id. The public key alone proves nothing: it is in every receipt. A name held with "
    "another key is refused (409, no challenge): choose another name, or deregister the "
    "old worker."
)


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json(ref: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}},
    }


ERRORS_COMMON = {
    "405": _error("Only POST is allowed."),
    "429": _error("Too many failed authentications from this address; wait `Retry-After` seconds."),
    "413": _error("The body is larger than the limit (FRLM_API_MAX_BODY, 64 KiB by default)."),
}

SIGNED_ERRORS = {
    "400": _error("Malformed JSON or invalid fields; `fields` names each field's errors."),
    "401": _error(
        "Missing, stale, replayed, non-canonical or bad signature; counts against the "
        "sending address (see 429), not the worker."
    ),
    "404": _error("No worker with this id: register first."),
    "410": _error("The worker was deregistered: stop, or register again."),
    **ERRORS_COMMON,
}

SIGNED_HEADERS = [
    {
        "name": "X-FRLM-Timestamp",
        "in": "header",
        "required": True,
        "description": "Epoch seconds when the request was signed.",
        "schema": {"type": "string", "pattern": "^[0-9]{1,12}(\\.[0-9]{1,6})?$"},
    },
    {
        "name": "X-FRLM-Signature",
        "in": "header",
        "required": True,
        "description": "base64 ed25519 signature; see the description of the API.",
        "schema": {"type": "string"},
    },
]


def schema(server_url: str = "") -> dict[str, Any]:
    """The whole document; `server_url` is where this server answers."""
    price = {"type": "number", "minimum": 0, "maximum": MAX_PRICE}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "FRLM worker registration API",
            "version": "1",
            "description": (
                "Workers join a venue with an enrolment token, then beat and leave with "
                "signed requests. Every error answers JSON {error, fix, fields?}: what is "
                "wrong and what to do.\n\n" + SIGNING + "\n\n" + THROTTLE + "\n\n" + TAKE_BACK
            ),
        },
        "servers": [{"url": server_url or "/"}],
        "paths": {
            "/api/workers/register": {
                "post": {
                    "operationId": "worker_register",
                    "summary": "Register a worker in the enrolment token's venue",
                    "description": TAKE_BACK,
                    "security": [{"enrolmentToken": []}],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/Registration"}
                            }
                        },
                    },
                    "responses": {
                        "201": _json("Registered", "Registered."),
                        "400": _error("Malformed JSON or invalid fields (see `fields`)."),
                        "401": _error(
                            "No token, or an unknown, expired or revoked one; or a "
                            "`challenge_sig` that is not the key's signature."
                        ),
                        "409": _error(
                            "The name is held: with another key (choose another name), or "
                            "with this key (the body's `challenge` is to be signed)."
                        ),
                        **ERRORS_COMMON,
                    },
                }
            },
            "/api/workers/{worker_id}/heartbeat": {
                "post": {
                    "operationId": "worker_heartbeat",
                    "summary": "Say the worker is alive, and how it is doing",
                    "description": (
                        "Send every `heartbeat_s` seconds. A worker whose heartbeats stop "
                        "leaves presence within seconds and is marked lost; its sub-queries "
                        "are sent elsewhere. A lost worker that beats again is active again. "
                        "More than FRLM_API_HEARTBEAT_LIMIT beats in "
                        "FRLM_API_HEARTBEAT_WINDOW_S (10 s; by default three times the "
                        "beats due) are answered 429 with `Retry-After`, without a strike."
                    ),
                    "parameters": [
                        {"name": "worker_id", "in": "path", "required": True, "schema": WORKER_ID},
                        *SIGNED_HEADERS,
                    ],
                    "security": [{"workerSignature": [], "workerTimestamp": []}],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/Heartbeat"}
                            }
                        },
                    },
                    "responses": {
                        "200": _json("HeartbeatAck", "Noted."),
                        **SIGNED_ERRORS,
                        "503": _error("Presence (Redis) is unreachable; retry at the next beat."),
                    },
                }
            },
            "/api/workers/{worker_id}/deregister": {
                "post": {
                    "operationId": "worker_deregister",
                    "summary": "Leave for good (after finishing in-flight work)",
                    "parameters": [
                        {"name": "worker_id", "in": "path", "required": True, "schema": WORKER_ID},
                        *SIGNED_HEADERS,
                    ],
                    "security": [{"workerSignature": [], "workerTimestamp": []}],
                    "requestBody": {
                        "required": False,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/Deregister"}
                            }
                        },
                    },
                    "responses": {"200": _json("Deregistered", "Gone."), **SIGNED_ERRORS},
                }
            },
            "/api/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "responses": {
                        "200": {
                            "description": "The OpenAPI 3 document.",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        "405": _error("Only GET is allowed."),
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {
                "enrolmentToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An enrolment token of the venue (`manage.py frlm_token`).",
                },
                "workerSignature": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-FRLM-Signature",
                    "description": SIGNING,
                },
                "workerTimestamp": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-FRLM-Timestamp",
                    "description": "Epoch seconds when the request was signed.",
                },
            },
            "schemas": {
                "Registration": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "venue", "concurrency", "public_key"],
                    "properties": {
                        "name": {
                            "type": "string",
                            "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                            "description": "Unique among the venue's registered workers.",
                        },
                        "venue": {
                            "type": "string",
                            "description": "Must be the enrolment token's venue.",
                        },
                        "models": {
                            "type": "array",
                            "maxItems": MAX_MODELS,
                            "uniqueItems": True,
                            "items": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,128}$"},
                            "description": "Models served; [] serves any.",
                            "default": [],
                        },
                        "concurrency": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_CONCURRENCY,
                        },
                        "context_tokens": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_CONTEXT_TOKENS,
                            "default": 128_000,
                        },
                        "price_in": {**price, "description": "Dollars per 1,000 input tokens."},
                        "price_out": {**price, "description": "Dollars per 1,000 output tokens."},
                        "public_key": {
                            "type": "string",
                            "description": "Standard base64 of the 32-byte ed25519 public key.",
                            "minLength": 44,
                            "maxLength": 44,
                        },
                        "challenge": {
                            "type": "string",
                            "description": "Only to take back a held name: the 409's challenge.",
                        },
                        "challenge_sig": {
                            "type": "string",
                            "description": (
                                "base64 signature by the worker's key of the canonical JSON of "
                                "{challenge, name, public_key, venue}."
                            ),
                        },
                    },
                },
                "Registered": {
                    "type": "object",
                    "required": [
                        "worker_id",
                        "queue",
                        "venue",
                        "venue_queue",
                        "heartbeat_s",
                        "trusted",
                    ],
                    "properties": {
                        "worker_id": WORKER_ID,
                        "queue": {"type": "string", "description": "worker.<id>: its own queue"},
                        "venue": {"type": "string"},
                        "venue_queue": {"type": "string", "description": "venue.<name>"},
                        "heartbeat_s": {
                            "type": "number",
                            "description": "Beat this often.",
                            "example": settings.FRLM_WORKER_HEARTBEAT_S,
                        },
                        "trusted": {
                            "type": "boolean",
                            "description": (
                                "Only a trusted venue's workers may consume the broker "
                                "(prefetching FRLM_WORKER_PREFETCH jobs per slot); the others "
                                "join through the gateway, which gives each a buffer of "
                                "FRLM_GATEWAY_BUFFER of its slots beyond them."
                            ),
                        },
                    },
                },
                "Heartbeat": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "inflight": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
                        "memory_mb": {"type": "number", "minimum": 0, "maximum": 1e12},
                        "latency_ms": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 1e12,
                            "nullable": True,
                            "description": "Median of recent sub-queries; null before any.",
                        },
                        "pid": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                        "draining": {
                            "type": "boolean",
                            "description": "Shutting down: send it nothing new.",
                        },
                    },
                },
                "HeartbeatAck": {
                    "type": "object",
                    "required": ["worker_id", "status", "heartbeat_s", "load"],
                    "properties": {
                        "worker_id": WORKER_ID,
                        "status": {"type": "string", "enum": ["active"]},
                        "heartbeat_s": {"type": "number"},
                        "load": {"type": "number", "minimum": 0},
                    },
                },
                "Deregister": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"reason": {"type": "string"}},
                },
                "Deregistered": {
                    "type": "object",
                    "required": ["worker_id", "status"],
                    "properties": {
                        "worker_id": WORKER_ID,
                        "status": {"type": "string", "enum": ["deregistered"]},
                    },
                },
                "Error": {
                    "type": "object",
                    "required": ["error", "fix"],
                    "properties": {
                        "error": {"type": "string", "description": "What is wrong."},
                        "fix": {"type": "string", "description": "What to do about it."},
                        "fields": {
                            "type": "object",
                            "additionalProperties": {"type": "array", "items": {"type": "string"}},
                            "description": "Each invalid field's errors.",
                        },
                        "challenge": {
                            "type": "string",
                            "description": "On a 409 for a name held with this key: sign it.",
                        },
                    },
                },
            },
        },
    }
