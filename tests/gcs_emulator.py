"""`gcp-storage-emulator start ...` that also sends the generation headers of an object download.

Cloud Storage answers every object download with `x-goog-generation` and
`x-goog-metageneration`; the emulator leaves them out. tensorstore (orbax's array store)
takes an object's generation from those headers and conditions its next write of the same
object on it, so without them a checkpoint save in the bucket fails now and then with
"Malformed StorageGeneration". Everything else is the emulator as released.

  python tests/gcs_emulator.py start --host=127.0.0.1 --port=PORT --in-memory
"""

from gcp_storage_emulator.handlers import objects

_download = objects.download


def _download_with_generation(request, response, storage, *args, **kwargs):
  try:
    obj = storage.get_file_obj(request.params['bucket_name'], request.params['object_id'])
  except Exception:  # a missing object: the emulator's own handler answers 404
    obj = {}
  for key in ('generation', 'metageneration'):
    if obj.get(key):
      response[f'x-goog-{key}'] = str(obj[key])
  return _download(request, response, storage, *args, **kwargs)


objects.download = _download_with_generation  # before the server module builds its routes

from gcp_storage_emulator.__main__ import main  # noqa: E402

if __name__ == '__main__':
  main()
