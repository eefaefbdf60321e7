"""The TensorFlow side: session hook, GraphDef -> IR frontend, graph rewrite, guard, Horovod.

The only package that imports TensorFlow or Horovod, and only lazily, inside the
modules that need them.
"""
