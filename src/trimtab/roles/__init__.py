"""The three roles of a job: the coordinator, the servers, and the workers' client side."""
