"""The worker's client side: requests to the coordinator and the servers, and the routing
context (placement map, barriers, broadcast) that the torch front end uses."""
