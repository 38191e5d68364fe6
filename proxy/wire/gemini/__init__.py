"""Google Gemini (generateContent): its route, request view, replies, stream relay and native
upstream (Google AI Studio's REST API)."""
