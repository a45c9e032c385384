"""Sources: each reads committed changes from one system and yields chunks of events.

Nothing is imported here: the decoder child processes import their modules from this
package and should not pay for the parent's (``base`` pulls in the actor runtime).
"""
