# session/: Scaffold, SessionManager, MonitoredSession, Supervisor, Coordinator, config.
