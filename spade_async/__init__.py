"""SPADE-async: asyncio core of the self-play environment-design daemon."""
