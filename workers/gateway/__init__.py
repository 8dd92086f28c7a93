"""The worker gateway: how a worker on another machine, with no broker credentials and no
shared disk, takes part in runs. It holds one WebSocket to the web server (`server.py`,
a Channels consumer), over which the server sends it the jobs of its queues with their
fragments' text read in, and takes back its signed results, its span events and its
heartbeats, stamped with the identity it proved (`protocol.py` says what travels;
`agent.py` is the worker's side)."""
