"""producer: the client side of sandfarm (SDK, batch runner, CLI). Never imports worker code."""
