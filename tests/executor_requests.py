"""What the executor tests (tests/integration/executors/) ask for: three tools (weather, flight, hotel) as
records and as OpenAI tools, and a conversation of a system prompt and one user message."""

from __future__ import annotations

from tracer.core.types import Tool

WEATHER = Tool("get_weather", "Current weather in a city.",
               {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}})
FLIGHT = Tool("book_flight", "Book a flight.",
              {"type": "object", "properties": {"origin": {"type": "string"}, "dest": {"type": "string"},
                                                "seats": {"type": "integer"}}})
HOTEL = Tool("book_hotel", "Book a hotel.", {"type": "object", "properties": {"city": {"type": "string"}}})
TOOLS = [WEATHER.to_openai(), FLIGHT.to_openai(), HOTEL.to_openai()]


def user(text: str) -> list[dict]:
    return [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": text}]
