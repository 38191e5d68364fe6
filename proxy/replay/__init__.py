"""`agentproxy replay`: a recorded session or a JSONL trace run offline through a policy."""
