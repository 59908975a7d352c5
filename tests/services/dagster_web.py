"""A Dagster webserver as the end-to-end tests talk to it: its GraphQL API, and whether it answers."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass


@dataclass
class DagsterWeb:
    url: str  # http://host:port

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        """The answer's data; fails the test on any GraphQL error."""
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        assert "errors" not in answer, answer["errors"]
        return answer["data"]

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/server_info", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False
