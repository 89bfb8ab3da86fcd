"""What a client's call carries to its broker and back (envelope), and the order a client's calls
apply in (ordering). Both sides use them: the client's handles and the running broker.
"""
