"""Model files: where they are, what their headers say, how they render chats."""
