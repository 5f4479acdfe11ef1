"""buzz.live: the hub and publisher, live delivery, hub loss, two nodes on one database and Redis."""
