"""Public API schemas of API tokens: what POST /v1/tokens takes, and a token as clients see it (its secret only
once, when it is made)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, StrictFloat, field_validator

from enginefarm.core.names import project_problem
from enginefarm.core.text import CatalogText
from storage.db import as_utc
from storage.tables import ApiTokenRow
from storage.tokens import lifetime_problem, token_state


class TokenIn(BaseModel):
    name: CatalogText = Field(min_length=1, max_length=100)
    scopes: list[str] = Field(min_length=1, max_length=3, description="read, build and/or admin")
    expires_in_days: StrictFloat | None = Field(
        default=None, description="1 second (1.16e-05 days) to 3650 days; none: until revoked"
    )
    project: str | None = Field(
        default=None,
        description="limit the token to one project's models (none: the whole "
        "farm); ASCII letters, digits, '-', '_' or '.'",
    )

    @field_validator("expires_in_days")
    @classmethod
    def _lifetime(cls, days: float | None) -> float | None:
        if days is not None and (problem := lifetime_problem(days)):
            raise ValueError(problem)
        return days

    @field_validator("project")
    @classmethod
    def _project(cls, project: str | None) -> str | None:
        if project is not None and (problem := project_problem(project)):
            raise ValueError(problem)
        return project


class CurrentTokenOut(BaseModel):
    """The asking token: its name, its highest scope (read < build < admin), the one project it belongs to (null:
    the whole farm), and when it expires (null: until revoked)."""

    name: str
    scope: str
    project: str | None
    expires_at: datetime | None


class TokenOut(BaseModel):
    id: int
    name: str
    prefix: str
    scopes: list[str]
    project: str | None
    state: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, row: ApiTokenRow) -> TokenOut:
        return cls(
            id=row.id,
            name=row.name,
            prefix=row.prefix,
            scopes=row.scopes,
            project=row.project,
            state=token_state(row),
            created_at=as_utc(row.created_at),
            expires_at=as_utc(row.expires_at),
            last_used_at=as_utc(row.last_used_at),
        )


class NewTokenOut(TokenOut):
    token: str = Field(description="the token; it is not stored and cannot be shown again")
