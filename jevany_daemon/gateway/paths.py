"""The paths the gateway treats apart, named once: the app routes them, the guard and the connection
protocol match on them before any route is chosen."""
SYSTEMONE_PATH = "/v1/systemone"
DECISIONS_PATH = "/v1/decisions"      # OpenAI's Decisions API: its error envelope from the guard on
BULK_PATH = "/v1/systemone/bulk"      # a body read line by line as it arrives, not gathered first
