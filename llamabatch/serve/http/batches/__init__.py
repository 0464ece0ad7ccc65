"""The Files and Batches API: uploads and what they hold, batches queued, run side by side and recorded."""
